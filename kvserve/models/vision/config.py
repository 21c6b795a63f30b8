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
