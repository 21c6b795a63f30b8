"""Idefics3 / SmolVLM: a SigLIP encoder (vision/siglip.py), a pixel-shuffle connector and a Llama
decoder (the shared CausalLMBase, unchanged).

The engine encodes an image's tiles with `encode_images`, then runs the decoder on
`embed_inputs(ids, rows)` through `forward(..., inputs_embeds=...)`; positions are the ordinary
token indices. A text-only request runs `forward(ids, positions)` exactly as a Llama does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from kvserve.models.common import CausalLMBase
from kvserve.models.config import ModelArchConfig
from kvserve.models.layers.attention.backend import AttentionBackend
from kvserve.models.vision.config import VisionArchConfig
from kvserve.models.vision.merge import scatter_image_rows
from kvserve.models.vision.siglip import SiglipVisionModel

# HF prefix -> ours: the decoder is our `model`, the vision side sits beside it.
_PREFIXES = (
    ("model.text_model.", "model."),
    ("model.vision_model.", "vision_model."),
    ("model.connector.", "connector."),
)


def pixel_shuffle(x: torch.Tensor, scale: int) -> torch.Tensor:
    """[num_tiles, side * side, dim] -> [num_tiles, (side / scale)**2, dim * scale**2]: each
    scale x scale block of patches becomes one token, its patches concatenated row by row
    (HF's `Idefics3Connector.pixel_shuffle`, written as one permute)."""
    num_tiles, num_patches, dim = x.shape
    side = int(num_patches**0.5)
    assert side * side == num_patches and side % scale == 0, (
        f"{num_patches} patches is no square grid of {scale}"
    )
    blocks = x.view(num_tiles, side // scale, scale, side // scale, scale, dim)  # [n, row, a, col, b, dim]
    return blocks.permute(0, 1, 3, 2, 4, 5).reshape(num_tiles, -1, scale * scale * dim)


class ModalityProjection(nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.proj = nn.Linear(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class Idefics3Connector(nn.Module):
    def __init__(self, vision: VisionArchConfig, text_hidden_size: int) -> None:
        super().__init__()
        self.scale_factor = vision.scale_factor
        in_features = vision.hidden_size * vision.scale_factor**2
        self.modality_projection = ModalityProjection(in_features, text_hidden_size)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return self.modality_projection(pixel_shuffle(patches, self.scale_factor))


class Idefics3ForConditionalGeneration(CausalLMBase):
    image_spans_bidirectional = False  # the decoder attends causally inside an image too

    def __init__(self, arch: ModelArchConfig, backend: AttentionBackend) -> None:
        super().__init__(arch, backend)
        assert arch.vision is not None, "an idefics3 arch carries its vision config"
        self.vision = arch.vision
        self.vision_model = SiglipVisionModel(arch.vision)
        self.connector = Idefics3Connector(arch.vision, arch.hidden_size)

    @property
    def image_token_id(self) -> int:
        return self.vision.image_token_id

    def count_image_rows(self, shape: tuple[int, ...], grid: tuple[int, int, int] | None = None) -> int:
        """Checked before a request is queued, from the tiles' shape: pixel_shuffle needs square
        tiles whose patch grid the scale factor divides. Image tokens take ordinary positions here,
        so an image on a position grid is a mistake."""
        if grid is not None:
            raise ValueError("this model's image tokens take ordinary positions: an image has no grid")
        vision = self.vision
        if len(shape) != 4:
            raise ValueError(f"pixel values must be [num_tiles, channels, side, side], not {tuple(shape)}")
        num_tiles, channels, height, width = shape
        grid = vision.patch_size * vision.scale_factor
        if num_tiles == 0 or channels != vision.num_channels or height != width or height % grid:
            raise ValueError(
                f"tiles must be {vision.num_channels}-channel squares whose side is a multiple of {grid} "
                f"pixels, not {tuple(shape)}"
            )
        return num_tiles * (height // grid) ** 2

    def encode_images(
        self, pixel_values: torch.Tensor, grids: Sequence[tuple[int, int, int] | None] = ()
    ) -> torch.Tensor:
        """Normalized tiles [num_tiles, channels, side, side] (the processor's output, every tile
        square and whole) -> decoder rows [num_tiles, tokens_per_tile, hidden_size]. `grids`: unused
        (tiles carry their layout)."""
        dtype = self.connector.modality_projection.proj.weight.dtype
        return self.connector(self.vision_model(pixel_values.to(dtype)))

    def embed_inputs(
        self, input_ids: torch.Tensor, image_rows: torch.Tensor, is_image: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[num_tokens] ids and the rows [num_image_tokens, hidden] of the image tokens among them,
        in order -> inputs_embeds [num_tokens, hidden] for `forward`. `is_image` [num_tokens] bool:
        which tokens take the rows (default: every image token)."""
        text_embeds = self.model.embed_tokens(input_ids)  # [num_tokens, hidden_size]
        return scatter_image_rows(input_ids, text_embeds, image_rows, self.vision.image_token_id, is_image)

    def strip_hf_prefix(self, hf_name: str) -> str | None:
        for prefix, ours in _PREFIXES:
            if hf_name.startswith(prefix):
                return ours + hf_name[len(prefix) :]
        return hf_name  # lm_head.weight
