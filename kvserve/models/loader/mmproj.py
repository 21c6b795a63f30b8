"""llama.cpp's vision projector file (`mmproj-*.gguf`: a `clip` GGUF of type `mmproj`, written by
`convert_hf_to_gguf.py --mmproj`) beside a language GGUF: which file (`find_mmproj`), its header
checked against the language model (`read_mmproj`), the Idefics3 config the pair makes
(`idefics3_hf_config`) and its tensors under HF names (`iter_mmproj_tensors`).

Only the `idefics3` projector (SmolVLM) is read. The image processor's settings come from the
file's `clip.vision.*` keys (tile = `image_size`, longest edge = `preproc_image_size`, mean/std),
not from a preprocessor_config.json.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvserve.models.errors import CorruptModelFileError, ModelNotFoundError, UnsupportedModelError
from kvserve.models.loader.gguf import SUPPORTED_TYPES, dequantize
from kvserve.models.loader.gguf_reader import GGUFFile, read_gguf
from kvserve.models.vision.idefics3_processor import Idefics3ProcessorConfig

logger = logging.getLogger(__name__)

MMPROJ_AUTO, MMPROJ_NONE = "auto", "none"
_PROJECTOR_TYPES = ("idefics3",)
_NUM_CHANNELS = 3  # clip.cpp's encoders read RGB; the file does not say
# SmolVLM's processors resize the longest edge to 4 tiles (2048 for 512-pixel tiles, 1536 for 384).
_DEFAULT_TILES_PER_LONGEST_EDGE = 4

_GLOBAL_NAMES = {
    "v.patch_embd": "model.vision_model.embeddings.patch_embedding",
    "v.position_embd": "model.vision_model.embeddings.position_embedding",
    "v.post_ln": "model.vision_model.post_layernorm",
    "mm.model.fc": "model.connector.modality_projection.proj",
}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.out_proj",
    "ln1": "layer_norm1",
    "ln2": "layer_norm2",
    "ffn_up": "mlp.fc1",
    "ffn_down": "mlp.fc2",
}


@dataclass(frozen=True)
class Mmproj:
    """A checked mmproj header: the vision config in HF `vision_config` keys, the connector's
    pixel-shuffle factor and the image processor the file implies."""

    gguf: GGUFFile
    vision_config: dict[str, Any]
    scale_factor: int
    processor: Idefics3ProcessorConfig


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
    if projector not in _PROJECTOR_TYPES:
        raise UnsupportedModelError(
            path, f"projector type {projector!r} is not supported (have: {', '.join(_PROJECTOR_TYPES)})"
        )

    def key(name: str) -> Any:
        if f"clip.vision.{name}" not in meta:
            raise CorruptModelFileError(path, f"metadata key 'clip.vision.{name}' is missing")
        return meta[f"clip.vision.{name}"]

    if int(key("projection_dim")) != text_hidden_size:
        raise UnsupportedModelError(
            path,
            f"made for a language model of hidden size {key('projection_dim')}, "
            f"but the model's is {text_hidden_size}",
        )
    vision = {
        "hidden_size": int(key("embedding_length")),
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": int(key("attention.head_count")),
        "image_size": int(key("image_size")),
        "patch_size": int(key("patch_size")),
        "num_channels": _NUM_CHANNELS,
        "layer_norm_eps": _decimal(key("attention.layer_norm_epsilon")),
        "hidden_act": "gelu_pytorch_tanh",  # clip.use_gelu: ggml's gelu is the tanh form
    }
    scale_factor = int(meta.get("clip.vision.projector.scale_factor", 2))
    patch, tile = vision["patch_size"], vision["image_size"]
    if patch < 1 or scale_factor < 1 or tile % (patch * scale_factor):
        raise CorruptModelFileError(
            path,
            f"{tile}-px tiles are no whole grid of {patch}-px patches merged {scale_factor} x {scale_factor}",
        )
    _check_tensors(mmproj, vision, scale_factor, text_hidden_size)
    return Mmproj(mmproj, vision, scale_factor, _processor(meta, vision, scale_factor))


def _processor(meta: dict[str, Any], vision: dict[str, Any], scale_factor: int) -> Idefics3ProcessorConfig:
    """SmolVLM's processor (Lanczos resize, tiles, the global image, 1/255 then mean/std) with the
    sizes the file gives; what it lacks is SmolVLM's default."""
    tile = vision["image_size"]
    default = Idefics3ProcessorConfig()
    return Idefics3ProcessorConfig(
        longest_edge=int(meta.get("clip.vision.preproc_image_size", _DEFAULT_TILES_PER_LONGEST_EDGE * tile)),
        tile_size=tile,
        image_mean=_triple(meta.get("clip.vision.image_mean", default.image_mean)),
        image_std=_triple(meta.get("clip.vision.image_std", default.image_std)),
        image_seq_len=(tile // vision["patch_size"]) ** 2 // scale_factor**2,
    )


def _decimal(value: float) -> float:
    """A float32 key as the shortest decimal that rounds to it: the value the converter was given
    (1e-06, not 9.99999997e-07), so the arch config is the folder's."""
    return float(str(np.float32(value)))


def _triple(values: Any) -> tuple[float, float, float]:
    a, b, c = (float(v) for v in values)
    return (a, b, c)


def idefics3_hf_config(text_config: dict[str, Any], mmproj: Mmproj, image_token_id: int) -> dict[str, Any]:
    """The config.json of the HF Idefics3 checkpoint the pair was made from (arch_config_from_hf
    reads it like a folder's)."""
    return {
        "model_type": "idefics3",
        "architectures": ["Idefics3ForConditionalGeneration"],
        "text_config": text_config,
        "vision_config": mmproj.vision_config,
        "scale_factor": mmproj.scale_factor,
        "image_token_id": image_token_id,
        "tie_word_embeddings": text_config["tie_word_embeddings"],
    }


def iter_mmproj_tensors(mmproj: Mmproj, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor in `dtype`) for every tensor of the file (names and shapes already checked)."""
    for info in mmproj.gguf.tensors:
        weights = dequantize(mmproj.gguf.raw(info), info.ggml_type, info.shape)
        yield hf_vision_name(info.name), weights.to(dtype)


def hf_vision_name(gguf_name: str) -> str:
    """HF parameter name of an mmproj tensor (KeyError for one Idefics3 has no place for)."""
    stem, _, suffix = gguf_name.rpartition(".")
    if suffix not in ("weight", "bias"):
        raise KeyError(gguf_name)
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{suffix}"
    parts = stem.split(".")
    if len(parts) != 4 or parts[:2] != ["v", "blk"] or not parts[2].isdigit():
        raise KeyError(gguf_name)
    return f"model.vision_model.encoder.layers.{parts[2]}.{_LAYER_NAMES[parts[3]]}.{suffix}"


def _expected_shapes(vision: dict[str, Any], scale_factor: int, text_hidden_size: int) -> dict[str, tuple]:
    """Every tensor an idefics3 mmproj holds, in torch order; the patch embedding is the conv
    kernel [hidden, channels, patch, patch] (ggml's [patch, patch, channels, hidden] reversed)."""
    hidden, ffn, patch = vision["hidden_size"], vision["intermediate_size"], vision["patch_size"]
    num_positions = (vision["image_size"] // patch) ** 2
    shapes: dict[str, tuple] = {
        "v.patch_embd.weight": (hidden, _NUM_CHANNELS, patch, patch),
        "v.patch_embd.bias": (hidden,),
        "v.position_embd.weight": (num_positions, hidden),
        "v.post_ln.weight": (hidden,),
        "v.post_ln.bias": (hidden,),
        "mm.model.fc.weight": (text_hidden_size, hidden * scale_factor**2),
    }
    per_layer = {"attn_q": (hidden, hidden), "attn_k": (hidden, hidden), "attn_v": (hidden, hidden)}
    per_layer |= {"attn_out": (hidden, hidden), "ln1": (hidden,), "ln2": (hidden,)}
    per_layer |= {"ffn_up": (ffn, hidden), "ffn_down": (hidden, ffn)}
    for layer in range(vision["num_hidden_layers"]):
        for name, shape in per_layer.items():
            shapes[f"v.blk.{layer}.{name}.weight"] = shape
            shapes[f"v.blk.{layer}.{name}.bias"] = shape[:1]
    return shapes


def _check_tensors(
    mmproj: GGUFFile, vision: dict[str, Any], scale_factor: int, text_hidden_size: int
) -> None:
    expected = _expected_shapes(vision, scale_factor, text_hidden_size)
    for info in mmproj.tensors:
        if info.name not in expected:
            raise UnsupportedModelError(
                mmproj.path, f"unknown tensor {info.name!r} for an idefics3 projector"
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
