"""Qwen2.5-VL's vision tower against transformers' `Qwen2_5_VisionTransformerPretrainedModel` in fp32
on tiny random weights (one image, several of different grids in one call, grids that are no whole
number of windows, two frames), and its weight names and shapes against the real 3B's, on the meta
device."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvserve.models.vision.config import Qwen2_5VisionConfig, qwen2_5_vl_vision_from_hf
from kvserve.models.vision.qwen2_5_vl_vision import (
    Qwen2_5VisionTransformer,
    plan_windows,
    strip_vision_prefix,
)
from tests.models.tiny_qwen_vl import QWEN25_VL_3B, hf_config

ATOL = 1e-5  # measured: ~6e-8 (fp32 RMSNorm and batched attention round differently)

# Patches of 4 pixels, merged 2 x 2, windows of 16 pixels: 2 x 2 merged tokens per window.
TINY_VISION = {
    "depth": 3, "hidden_size": 32, "intermediate_size": 48, "num_heads": 4, "out_hidden_size": 24,
    "patch_size": 4, "temporal_patch_size": 2, "spatial_merge_size": 2, "window_size": 16,
    "fullatt_block_indexes": [1],
}  # fmt: skip


@pytest.fixture(scope="module")
def pair() -> tuple[Any, Qwen2_5VisionTransformer]:
    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    config = Qwen2_5_VLConfig(vision_config=TINY_VISION)
    torch.manual_seed(0)
    hf = Qwen2_5_VisionTransformerPretrainedModel._from_config(config.vision_config).eval()
    ours = Qwen2_5VisionTransformer(qwen2_5_vl_vision_from_hf(config.to_dict())).eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    return hf, ours


# (t, h, w) patch grids: one window; 2 x 2 windows; 3 x 4 windows with padding (5 x 7 merged tokens);
# two images of different grids; three with the smallest possible image; two frames.
GRIDS = {
    "one-window": [(1, 4, 4)],
    "whole-windows": [(1, 8, 8)],
    "padded": [(1, 10, 14)],
    "two-images": [(1, 8, 8), (1, 6, 10)],
    "three-images": [(1, 10, 14), (1, 2, 2), (1, 12, 4)],
    "two-frames": [(2, 6, 8)],
}  # fmt: skip


@pytest.mark.parametrize("name", list(GRIDS))
def test_tower_matches_transformers(pair: tuple[Any, Qwen2_5VisionTransformer], name: str) -> None:
    hf, ours = pair
    grid_thw = torch.tensor(GRIDS[name])
    num_patches = int(grid_thw.prod(-1).sum())
    pixels = torch.randn(num_patches, 3 * 2 * 4 * 4, generator=torch.Generator().manual_seed(len(name)))
    with torch.no_grad():
        expected = hf(pixels, grid_thw=grid_thw).pooler_output
        got = ours(pixels, grid_thw)
    assert got.shape == (num_patches // 4, 24)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


def test_images_do_not_see_each_other(pair: tuple[Any, Qwen2_5VisionTransformer]) -> None:
    """An image's rows are the same alone and beside another (attention never crosses images)."""
    _, ours = pair
    first, second = torch.randn(64, 96), torch.randn(60, 96)
    with torch.no_grad():
        alone = ours(first, torch.tensor([(1, 8, 8)]))
        together = ours(torch.cat([first, second]), torch.tensor([(1, 8, 8), (1, 6, 10)]))
    torch.testing.assert_close(together[:16], alone, atol=ATOL, rtol=0)


def test_window_plan_is_hf_window_index() -> None:
    from transformers.vision_utils import get_vision_window_index

    config = Qwen2_5VisionConfig(patch_size=4, window_size=16, spatial_merge_size=2)
    grids = [(1, 10, 14), (1, 8, 8), (2, 6, 2)]
    plan = plan_windows(grids, config)
    window_index, cu_window_seqlens = get_vision_window_index(torch.tensor(grids), 2, 16, 4)
    assert torch.equal(plan.window_index, window_index)
    lengths = sorted(cu_window_seqlens.diff().tolist())
    assert sorted(n for g in plan.windows.groups for n in [g.shape[1]] * g.shape[0]) == lengths


def test_real_shapes_map_one_to_one() -> None:
    """Qwen2.5-VL-3B's tower, both sides on the meta device: every HF tensor (the `model.visual.`
    names of transformers 5's module tree) is one of ours with its shape, and the Hub's `visual.` names map too."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    config = hf_config(QWEN25_VL_3B, vocab_size=151936)
    with torch.device("meta"):
        hf = Qwen2_5_VLForConditionalGeneration(config)
        ours = Qwen2_5VisionTransformer(qwen2_5_vl_vision_from_hf(config.to_dict()))
    hf_shapes = {
        strip_vision_prefix(name): tuple(t.shape)
        for name, t in hf.state_dict().items()
        if strip_vision_prefix(name) is not None
    }
    our_shapes = {f"visual.{name}": tuple(t.shape) for name, t in ours.state_dict().items()}
    assert hf_shapes == our_shapes
    assert len(our_shapes) == 32 * 12 + 1 + 5
    assert strip_vision_prefix("visual.blocks.0.attn.qkv.weight") == "visual.blocks.0.attn.qkv.weight"
    assert strip_vision_prefix("model.language_model.layers.0.mlp.up_proj.weight") is None
    vision = qwen2_5_vl_vision_from_hf(config.to_dict())
    assert (vision.hidden_size, vision.out_hidden_size, vision.fullatt_block_indexes) == (
        1280,
        2048,
        (7, 15, 23, 31),
    )


def test_config_of_the_hub_file() -> None:
    """Qwen2.5-VL-3B-Instruct's config.json as the Hub has it (`in_chans`, ids at the top)."""
    hub = {
        "image_token_id": 151655, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
        "vision_config": {
            "depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
            "in_chans": 3, "out_hidden_size": 2048, "patch_size": 14, "spatial_merge_size": 2,
            "spatial_patch_size": 14, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
            "tokens_per_second": 2, "temporal_patch_size": 2,
        },
    }  # fmt: skip
    assert qwen2_5_vl_vision_from_hf(hub) == Qwen2_5VisionConfig()


def test_patches_must_fill_the_grids(pair: tuple[Any, Qwen2_5VisionTransformer]) -> None:
    with pytest.raises(ValueError, match=r"60 patches for patch grids \[\(1, 8, 8\)\]"):
        pair[1](torch.randn(60, 96), torch.tensor([(1, 8, 8)]))


@pytest.mark.parametrize("grid", [(1, 3, 4), (1, 4, 0), (0, 4, 4)])
def test_a_grid_of_broken_merge_blocks_is_refused(grid: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError, match="whole 2 x 2 blocks"):
        plan_windows([grid], Qwen2_5VisionConfig())
