"""What every mmproj projector format (`mmproj_idefics3.py`, `mmproj_qwen2_5_vl.py`) is and uses:
the `ProjectorFormat` protocol, the `ProjectorHeader` it reads, the file's keys and tensors."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from kvserve.models.errors import CorruptModelFileError
from kvserve.models.loader.gguf import dequantize
from kvserve.models.loader.gguf_reader import GGUFFile, GGUFTensorInfo
from kvserve.models.vision.idefics3_processor import Idefics3ProcessorConfig
from kvserve.models.vision.qwen2_vl_processor import Qwen2VLProcessorConfig

ImageProcessorConfig = Idefics3ProcessorConfig | Qwen2VLProcessorConfig


class MmprojKeys:
    """The file's metadata, read so that a missing required key names the file."""

    def __init__(self, gguf: GGUFFile) -> None:
        self.path, self.metadata = gguf.path, gguf.metadata

    def vision(self, name: str) -> Any:
        """The required key `clip.vision.<name>`."""
        if f"clip.vision.{name}" not in self.metadata:
            raise CorruptModelFileError(self.path, f"metadata key 'clip.vision.{name}' is missing")
        return self.metadata[f"clip.vision.{name}"]

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)


@dataclass(frozen=True)
class ProjectorHeader:
    """What a projector format reads from the header: the HF `vision_config`, the HF config's other
    keys it sets, the image processor and every tensor the file must hold (shape in torch order)."""

    vision_config: dict[str, Any]
    top_level: dict[str, Any]
    processor: ImageProcessorConfig
    tensor_shapes: dict[str, tuple[int, ...]]
    summary: str  # for the log line


class ProjectorFormat(Protocol):
    """One `clip.projector_type`: the language GGUF it goes with, the prompt tokens whose ids its HF
    config names, and how its header and tensors map onto the HF checkpoint the pair came from."""

    projector_type: str
    language_architecture: str  # the language GGUF's `general.architecture`
    token_keys: tuple[tuple[str, str], ...]  # (HF config key, the token whose id it holds)

    def read_header(self, keys: MmprojKeys, text_hidden_size: int) -> ProjectorHeader: ...

    def hf_config(
        self,
        language: GGUFFile,
        text_config: dict[str, Any],
        header: ProjectorHeader,
        token_ids: dict[str, int],
    ) -> dict[str, Any]:
        """The config.json of the HF checkpoint (arch_config_from_hf reads it like a folder's)."""
        ...

    def hf_tensors(self, mmproj: GGUFFile) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, float32 tensor) for every tensor of the (checked) file."""
        ...


def load_tensor(mmproj: GGUFFile, info: GGUFTensorInfo) -> torch.Tensor:
    """One tensor of the file, dequantized to float32 (torch order)."""
    return dequantize(mmproj.raw(info), info.ggml_type, info.shape)


def decimal(value: float) -> float:
    """A float32 key as the shortest decimal that rounds to it: the value the converter was given
    (1e-06, not 9.99999997e-07), so the arch config is the folder's."""
    return float(str(np.float32(value)))


def triple(values: Any) -> tuple[float, float, float]:
    """A per-channel float32 key (mean, std), each value as `decimal` gives it."""
    a, b, c = (decimal(v) for v in values)
    return (a, b, c)
