"""The mmproj half of llama.cpp's pair, as `convert_hf_to_gguf.py --mmproj` writes it: the keys every
projector states (`MmprojModel`), then SmolVLM's (`idefics3`) or Qwen2.5-VL's (`qwen2.5vl_merger`:
the Conv3d patch embedding split per frame, the fused QKV split, the window pattern), with tensor
names from gguf-py's own map. loader/mmproj*.py reads them back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import gguf
import torch

from kvserve.models.config import ModelArchConfig
from kvserve.models.loader.gguf_write import FILE_TYPES, OutType, add_tensor, finish
from kvserve.models.vision.config import Qwen2_5VisionConfig, VisionArchConfig
from kvserve.models.vision.idefics3_processor import Idefics3ProcessorConfig
from kvserve.models.vision.qwen2_vl_processor import Qwen2VLProcessorConfig


class _Tower(NamedTuple):
    """The tower's sizes every mmproj states."""

    image_size: int
    patch_size: int
    hidden_size: int
    intermediate_size: int
    num_blocks: int
    num_heads: int


def _mmproj_writer(
    path: Path,
    name: str,
    outtype: OutType,
    text_hidden_size: int,
    tower: _Tower,
    image_mean: tuple[float, float, float],
    image_std: tuple[float, float, float],
) -> gguf.GGUFWriter:
    """A writer holding MmprojModel.set_gguf_parameters' keys, for a projector's own to follow."""
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.MMPROJ])
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_name(name)
    writer.add_file_type(FILE_TYPES[outtype])
    writer.add_clip_has_vision_encoder(True)
    writer.add_vision_projection_dim(text_hidden_size)
    writer.add_vision_image_size(tower.image_size)
    writer.add_vision_patch_size(tower.patch_size)
    writer.add_vision_embedding_length(tower.hidden_size)
    writer.add_vision_feed_forward_length(tower.intermediate_size)
    writer.add_vision_block_count(tower.num_blocks)
    writer.add_vision_head_count(tower.num_heads)
    writer.add_vision_image_mean(list(image_mean))
    writer.add_vision_image_std(list(image_std))
    return writer


def write_mmproj(
    path: Path,
    name: str,
    vision: VisionArchConfig,
    text_hidden_size: int,
    processor: Idefics3ProcessorConfig,
    tensors: dict[str, torch.Tensor],
    outtype: OutType,
) -> None:
    """MmprojModel.set_gguf_parameters + SmolVLMModel's: the keys llama.cpp's clip.cpp reads."""
    if vision.hidden_act != "gelu_pytorch_tanh":
        raise ValueError(f"{name}: clip.cpp's idefics3 encoder runs gelu (tanh), not {vision.hidden_act}")
    tower = _Tower(
        vision.image_size,
        vision.patch_size,
        vision.hidden_size,
        vision.intermediate_size,
        vision.num_hidden_layers,
        vision.num_attention_heads,
    )
    writer = _mmproj_writer(
        path, name, outtype, text_hidden_size, tower, processor.image_mean, processor.image_std
    )
    writer.add_clip_projector_type(gguf.VisionProjectorType.IDEFICS3)
    writer.add_vision_attention_layernorm_eps(vision.layer_norm_eps)
    writer.add_vision_projector_scale_factor(vision.scale_factor)
    writer.add_vision_use_gelu(True)
    writer.add_vision_preproc_image_size(processor.longest_edge)
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, vision.num_hidden_layers)
    for hf_name, tensor in tensors.items():
        gguf_name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"{name}: no GGUF name for vision tensor {hf_name!r}")
        # SmolVLMModel.tensor_force_quant: the patch and position embeddings stay f32.
        kept = "f32" if ".embeddings." in hf_name else outtype
        add_tensor(writer, gguf_name, tensor.float().numpy(), kept)
    finish(writer)


def write_qwen2_5_vl_mmproj(
    path: Path,
    name: str,
    hf_config: dict[str, Any],
    arch: ModelArchConfig,
    processor: Qwen2VLProcessorConfig,
    tensors: dict[str, torch.Tensor],
    outtype: OutType,
) -> None:
    """MmprojModel.set_gguf_parameters + Qwen2VLVisionModel's, and four keys the converter leaves
    to clip.cpp's fixed values (window, merge, pixel bounds: loader/mmproj_qwen2_5_vl.py)."""
    vision = arch.vision
    assert isinstance(vision, Qwen2_5VisionConfig)
    pattern = _window_pattern(name, vision)
    if vision.hidden_act != "silu" or vision.temporal_patch_size != 2:
        raise ValueError(f"{name}: clip.cpp's qwen2.5vl_merger runs SiLU over 2-frame patches")
    # Qwen2VLVisionModel: a config without image_size (all of Qwen2.5-VL's) says 560.
    image_size = int(hf_config.get("vision_config", {}).get("image_size", 560))
    tower = _Tower(
        image_size,
        vision.patch_size,
        vision.hidden_size,
        vision.intermediate_size,
        vision.depth,
        vision.num_heads,
    )
    writer = _mmproj_writer(
        path, name, outtype, arch.hidden_size, tower, processor.image_mean, processor.image_std
    )
    writer.add_clip_projector_type(gguf.VisionProjectorType.QWEN25VL)
    writer.add_vision_use_silu(True)
    writer.add_vision_n_wa_pattern(pattern)
    # The converter's: the top level's rms_norm_eps (the released configs'), else HF's default.
    writer.add_vision_attention_layernorm_eps(float(hf_config.get("rms_norm_eps", 1e-6)))
    writer.add_vision_spatial_merge_size(vision.spatial_merge_size)
    writer.add_vision_window_size(vision.window_size)
    writer.add_vision_min_pixels(processor.min_pixels)
    writer.add_vision_max_pixels(processor.max_pixels)
    # The merger's `mlp.2` is block 2 of the map: a tower of fewer blocks still needs it.
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, max(vision.depth, 3))
    for hf_name, tensor in tensors.items():
        for gguf_name, values in _qwen_vision_tensors(name_map, hf_name, tensor.float()):
            add_tensor(writer, gguf_name, values.numpy(), outtype)
    finish(writer)


def _window_pattern(name: str, vision: Qwen2_5VisionConfig) -> int:
    """`n_wa_pattern`: clip.cpp gives block i full attention when (i + 1) % n == 0, so the folder's
    `fullatt_block_indexes` must be exactly those (the converter checks only their spacing)."""
    indexes = list(vision.fullatt_block_indexes)
    pattern = indexes[0] + 1 if indexes else 0
    if not indexes or indexes != [i for i in range(vision.depth) if (i + 1) % pattern == 0]:
        raise ValueError(f"{name}: full-attention blocks {indexes} are no (i + 1) % n == 0 pattern")
    return pattern


def _qwen_vision_tensors(
    name_map: gguf.TensorNameMap, hf_name: str, tensor: torch.Tensor
) -> Iterator[tuple[str, torch.Tensor]]:
    """Qwen2VLVisionModel.modify_tensors: the Conv3d patch embedding as one Conv2d kernel per frame,
    the fused QKV as q, k, v; the rest by gguf-py's map."""
    if hf_name == "visual.patch_embed.proj.weight":  # [hidden, channels, frames, patch, patch]
        yield "v.patch_embd.weight", tensor[:, :, 0].contiguous()
        yield "v.patch_embd.weight.1", tensor[:, :, 1].contiguous()
        return
    if ".attn.qkv." in hf_name:
        for part, values in zip("qkv", tensor.chunk(3), strict=True):
            yield from _qwen_vision_tensors(name_map, hf_name.replace(".qkv.", f".{part}."), values)
        return
    gguf_name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
    if gguf_name is None:
        raise ValueError(f"no GGUF name for vision tensor {hf_name!r}")
    yield gguf_name, tensor
