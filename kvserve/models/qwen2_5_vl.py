"""Qwen2.5-VL: a windowed ViT with 2D rotary positions and a patch merger (vision/qwen2_5_vl_vision.py)
feeding a Qwen2 decoder whose RoPE is M-RoPE.

Images come at their own resolution: the processor resizes each to a multiple of 28 pixels and cuts
it into 14-pixel patches; every 2 x 2 patches become one decoder token. An image's tokens lie on
its (t, h, w) token grid in position space (`ImageInput.grid`, engine/positions.py), so the engine
hands this model three positions per token for steps that hold image tokens and one otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvserve.models.config import LayerType, ModelArchConfig
from kvserve.models.layers.attention.backend import AttentionBackend
from kvserve.models.layers.rotary import MRotaryEmbedding, RotaryEmbedding
from kvserve.models.qwen2 import Qwen2ForCausalLM
from kvserve.models.vision.config import Qwen2_5VisionConfig
from kvserve.models.vision.merge import scatter_image_rows
from kvserve.models.vision.qwen2_5_vl_vision import VISION_PREFIXES, Qwen2_5VisionTransformer, VisionRotary

# HF prefix -> ours. transformers 5 nests the decoder and the tower under `model.`; the released
# checkpoints (transformers 4) keep the decoder at `model.` and the tower at `visual.`.
_PREFIXES = (("model.language_model.", "model."), *VISION_PREFIXES, ("model.", "model."))


class Qwen2_5_VLForConditionalGeneration(Qwen2ForCausalLM):
    image_spans_bidirectional = False  # the decoder attends causally inside an image

    def __init__(self, arch: ModelArchConfig, backend: AttentionBackend) -> None:
        if not isinstance(arch.vision, Qwen2_5VisionConfig) or arch.mrope_section is None:
            raise ValueError("a qwen2_5_vl arch carries its vision config and mrope_section")
        super().__init__(arch, backend)
        self.vision: Qwen2_5VisionConfig = arch.vision
        self.visual = Qwen2_5VisionTransformer(arch.vision)

    def build_rotary(self, arch: ModelArchConfig, layer_type: LayerType) -> RotaryEmbedding:
        assert arch.mrope_section is not None
        return MRotaryEmbedding(arch.head_dim, arch.rope_theta, arch.rope_scaling_dict, arch.mrope_section)

    def reset_buffers(self) -> None:
        super().reset_buffers()
        for module in self.visual.modules():
            if isinstance(module, VisionRotary):
                module.reset_parameters()

    @property
    def image_token_id(self) -> int:
        return self.vision.image_token_id

    def count_image_rows(self, shape: tuple[int, ...], grid: tuple[int, int, int] | None = None) -> int:
        """An image is its patches [t*h*w * merge**2, channels * temporal * patch**2] and its token
        grid (t, h, w): every merge x merge patches become one token."""
        vision = self.vision
        if grid is None:
            raise ValueError("an image for this model needs its token grid (t, h, w)")
        t, h, w = grid
        merge = vision.spatial_merge_size
        patch_dim = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
        if min(grid) <= 0 or tuple(shape) != (t * h * w * merge**2, patch_dim):
            raise ValueError(
                f"an image of {t} x {h} x {w} tokens takes patches of shape ({t * h * w * merge**2}, "
                f"{patch_dim}), not {tuple(shape)}"
            )
        return t * h * w

    def encode_images(
        self, pixel_values: torch.Tensor, grids: Sequence[tuple[int, int, int] | None] = ()
    ) -> torch.Tensor:
        """Several images' patches, concatenated, with their token grids -> their decoder rows,
        [total_tokens, hidden_size], each image's row-major over its (h, w) grid."""
        merge = self.vision.spatial_merge_size
        if len(grids) == 0 or any(grid is None for grid in grids):
            raise ValueError("every image for this model needs its token grid")
        grid_thw = torch.tensor(
            [(t, h * merge, w * merge) for t, h, w in grids],  # type: ignore[misc]
            dtype=torch.int64,
        )
        dtype = self.model.embed_tokens.weight.dtype
        return self.visual(pixel_values.to(dtype), grid_thw)

    def embed_inputs(
        self, input_ids: torch.Tensor, image_rows: torch.Tensor, is_image: torch.Tensor | None = None
    ) -> torch.Tensor:
        text_embeds = self.model.embed_tokens(input_ids)  # [num_tokens, hidden_size]
        return scatter_image_rows(input_ids, text_embeds, image_rows, self.vision.image_token_id, is_image)

    def map_hf_name(self, hf_name: str) -> tuple[str, int | None] | None:
        name = self.strip_hf_prefix(hf_name)
        if name is not None and name.startswith("visual."):
            return name, None  # the tower keeps HF's own modules (no fused projections)
        return super().map_hf_name(hf_name)

    def strip_hf_prefix(self, hf_name: str) -> str | None:
        for prefix, ours in _PREFIXES:
            if hf_name.startswith(prefix):
                return ours + hf_name[len(prefix) :]
        return hf_name  # lm_head.weight
