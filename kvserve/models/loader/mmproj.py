"""llama.cpp's vision projector file (`mmproj-*.gguf`: a `clip` GGUF of type `mmproj`, written by
`convert_hf_to_gguf.py --mmproj`) beside a language GGUF: which file (`find_mmproj`), its header
checked against the language model and read by its projector type's `ProjectorFormat`
(`read_mmproj`), which also gives the HF config the pair makes, and the file's tensors under HF
names (`iter_mmproj_tensors`).

Two projector types are read: `idefics3` (SmolVLM, `mmproj_idefics3.py`) and `qwen2.5vl_merger`
(Qwen2.5-VL, `mmproj_qwen2_5_vl.py`). The image processor's settings come from the file's
`clip.vision.*` keys, not from a preprocessor_config.json.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from kvserve.models.errors import CorruptModelFileError, ModelNotFoundError, UnsupportedModelError
from kvserve.models.loader.gguf import SUPPORTED_TYPES
from kvserve.models.loader.gguf_reader import GGUFFile, read_gguf
from kvserve.models.loader.mmproj_format import (
    ImageProcessorConfig,
    MmprojKeys,
    ProjectorFormat,
    ProjectorHeader,
)
from kvserve.models.loader.mmproj_idefics3 import IDEFICS3
from kvserve.models.loader.mmproj_qwen2_5_vl import QWEN2_5_VL

logger = logging.getLogger(__name__)

MMPROJ_AUTO, MMPROJ_NONE = "auto", "none"


@dataclass(frozen=True)
class Mmproj:
    """A checked mmproj: the file, its format and what its header says."""

    gguf: GGUFFile
    format: ProjectorFormat
    header: ProjectorHeader

    @property
    def processor(self) -> ImageProcessorConfig:
        return self.header.processor


_FORMATS: dict[str, ProjectorFormat] = {f.projector_type: f for f in (IDEFICS3, QWEN2_5_VL)}


def find_mmproj(model_path: Path, choice: str | Path | None) -> Path | None:
    """The mmproj to load with the language GGUF at `model_path`: `choice` is a path, "none"
    (or None), or "auto": the one `mmproj*.gguf` beside the model file, logged; several are an
    error (which one is meant is unknown)."""
    if choice is None or str(choice) == MMPROJ_NONE:
        return None
    if str(choice) != MMPROJ_AUTO:
        path = Path(choice).expanduser()
        if not path.is_file():
            raise ModelNotFoundError(path, "no such mmproj file")
        return path
    found = sorted(p for p in model_path.parent.glob("mmproj*.gguf") if p.resolve() != model_path.resolve())
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise UnsupportedModelError(
            model_path, f"several mmproj files beside it ({names}): pick one with --mmproj, or --no-mmproj"
        )
    if found:
        logger.info("vision projector: %s (found beside the model; --no-mmproj to skip it)", found[0])
        return found[0]
    return None


def read_mmproj(path: Path, text_hidden_size: int) -> Mmproj:
    """Parse and check the header (keys, projector type, tensor names and shapes) of the mmproj at
    `path` for a language model of `text_hidden_size`; every mistake names the file."""
    mmproj = read_gguf(path)
    meta = mmproj.metadata
    if mmproj.architecture != "clip":
        raise UnsupportedModelError(path, f"not an mmproj file (architecture {mmproj.architecture!r})")
    projector = meta.get("clip.projector_type", meta.get("clip.vision.projector_type"))
    if projector not in _FORMATS:
        raise UnsupportedModelError(
            path, f"projector type {projector!r} is not supported (have: {', '.join(_FORMATS)})"
        )
    keys = MmprojKeys(mmproj)
    if int(keys.vision("projection_dim")) != text_hidden_size:
        raise UnsupportedModelError(
            path,
            f"made for a language model of hidden size {keys.vision('projection_dim')}, "
            f"but the model's is {text_hidden_size}",
        )
    try:
        header = _FORMATS[projector].read_header(keys, text_hidden_size)
    except (TypeError, ValueError) as error:  # a key of the wrong type (a string for a count)
        raise CorruptModelFileError(path, f"malformed {projector} metadata ({error})") from None
    _check_tensors(mmproj, projector, header.tensor_shapes)
    return Mmproj(mmproj, _FORMATS[projector], header)


def iter_mmproj_tensors(mmproj: Mmproj, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor in `dtype`) for every tensor of the file (names and shapes already checked)."""
    for name, tensor in mmproj.format.hf_tensors(mmproj.gguf):
        yield name, tensor.to(dtype)


def _check_tensors(mmproj: GGUFFile, projector: str, expected: dict[str, tuple[int, ...]]) -> None:
    for info in mmproj.tensors:
        if info.name not in expected:
            raise UnsupportedModelError(
                mmproj.path, f"unknown tensor {info.name!r} for a {projector} projector"
            )
        if info.shape != expected[info.name]:
            raise CorruptModelFileError(
                mmproj.path, f"tensor {info.name!r} is {info.shape}, expected {expected[info.name]}"
            )
        if info.ggml_type not in SUPPORTED_TYPES:
            raise UnsupportedModelError(
                mmproj.path, f"tensor {info.name!r} has unsupported type {info.ggml_type.name}"
            )
    missing = sorted(expected.keys() - mmproj.tensor_names)
    if missing:
        raise CorruptModelFileError(mmproj.path, f"{len(missing)} tensors missing, e.g. {missing[:3]}")
