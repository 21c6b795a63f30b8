"""The vision side of an image-text model: the encoder (SigLIP) and the connector that maps its
patches into the decoder's embedding space. Field names follow HF `vision_config`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class VisionArchConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int  # the side the learned position table covers
    patch_size: int
    num_channels: int = 3
    layer_norm_eps: float = 1e-6
    hidden_act: str = "gelu_pytorch_tanh"
    scale_factor: int = 2  # pixel shuffle: scale_factor**2 patches become one token
    image_token_id: int = 128257  # the placeholder each image row replaces in the prompt

    @property
    def num_patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def tokens_per_tile(self) -> int:
        """Decoder tokens of one full-size tile (HF's `image_seq_len`)."""
        return self.num_patches_per_side**2 // self.scale_factor**2


def idefics3_vision_from_hf(hf: dict[str, Any]) -> VisionArchConfig:
    """Idefics3 / SmolVLM `config.json` -> VisionArchConfig; defaults are HF's config classes'."""
    vision = hf.get("vision_config") or {}
    return VisionArchConfig(
        hidden_size=int(vision.get("hidden_size", 1152)),
        intermediate_size=int(vision.get("intermediate_size", 3072)),
        num_hidden_layers=int(vision.get("num_hidden_layers", 12)),
        num_attention_heads=int(vision.get("num_attention_heads", 16)),
        image_size=int(vision.get("image_size", 224)),
        patch_size=int(vision.get("patch_size", 32)),
        num_channels=int(vision.get("num_channels", 3)),
        layer_norm_eps=float(vision.get("layer_norm_eps", 1e-6)),
        hidden_act=str(vision.get("hidden_act", "gelu_pytorch_tanh")),
        scale_factor=int(hf.get("scale_factor", 2)),
        image_token_id=int(hf.get("image_token_id", 128257)),
    )


@dataclass(frozen=True)
class Qwen2_5VisionConfig:
    """Qwen2.5-VL's vision tower (HF `vision_config`) and the prompt tokens its images use (top level
    of `config.json`); the defaults are Qwen2.5-VL-3B-Instruct's."""

    depth: int = 32
    hidden_size: int = 1280
    intermediate_size: int = 3420
    num_heads: int = 16
    out_hidden_size: int = 2048  # the decoder's hidden size: the merger's output
    in_channels: int = 3
    patch_size: int = 14
    temporal_patch_size: int = 2  # an image is repeated to this many frames
    spatial_merge_size: int = 2  # merge x merge patches become one decoder token
    window_size: int = 112  # pixels per side of an attention window
    fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)  # blocks that attend over the whole image
    hidden_act: str = "silu"
    rope_theta: float = 10000.0
    image_token_id: int = 151655  # <|image_pad|>
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Values in one flattened patch: channels x frames x patch x patch."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def merger_window(self) -> int:
        """An attention window's side in decoder tokens (merged patches)."""
        return self.window_size // self.spatial_merge_size // self.patch_size


def qwen2_5_vl_vision_from_hf(hf: dict[str, Any]) -> Qwen2_5VisionConfig:
    """Qwen2.5-VL `config.json` -> Qwen2_5VisionConfig; missing fields take HF's defaults (the
    Hub's 3B/7B files write `in_chans`, transformers 5 `in_channels`)."""
    vision = hf.get("vision_config") or {}
    default = Qwen2_5VisionConfig()
    rope = vision.get("rope_parameters") or {}
    return Qwen2_5VisionConfig(
        depth=int(vision.get("depth", 32)),
        hidden_size=int(vision.get("hidden_size", 3584)),
        intermediate_size=int(vision.get("intermediate_size", default.intermediate_size)),
        num_heads=int(vision.get("num_heads", default.num_heads)),
        out_hidden_size=int(vision.get("out_hidden_size", 3584)),
        in_channels=int(vision.get("in_channels", vision.get("in_chans", default.in_channels))),
        patch_size=int(vision.get("patch_size", default.patch_size)),
        temporal_patch_size=int(vision.get("temporal_patch_size", default.temporal_patch_size)),
        spatial_merge_size=int(vision.get("spatial_merge_size", default.spatial_merge_size)),
        window_size=int(vision.get("window_size", default.window_size)),
        fullatt_block_indexes=tuple(
            int(i) for i in vision.get("fullatt_block_indexes", default.fullatt_block_indexes)
        ),
        hidden_act=str(vision.get("hidden_act", default.hidden_act)),
        rope_theta=float(rope.get("rope_theta", default.rope_theta)),
        image_token_id=int(hf.get("image_token_id", default.image_token_id)),
        vision_start_token_id=int(hf.get("vision_start_token_id", default.vision_start_token_id)),
        vision_end_token_id=int(hf.get("vision_end_token_id", default.vision_end_token_id)),
    )
