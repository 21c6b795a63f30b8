"""M-RoPE positions (engine/positions.py, runner/batch.py, layers/rotary.py): pure, against
transformers' Qwen2.5-VL `get_rope_index` and rotary embedding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvserve.engine.image_input import ImageInput
from kvserve.engine.outputs import ScheduledRequest
from kvserve.engine.positions import PositionLayout
from kvserve.engine.request import Request
from kvserve.engine.runner.batch import build_model_inputs
from kvserve.engine.sampling_params import SamplingParams
from kvserve.models.layers.rotary import MRotaryEmbedding, RotaryEmbedding

IMAGE, MERGE = 99, 2


def _image(offset: int, grid: tuple[int, int, int]) -> ImageInput:
    t, h, w = grid
    return ImageInput(f"img{offset}", offset, t * h * w, torch.zeros(t * h * w * MERGE**2, 8), grid=grid)


def _prompt(layout: list[int | tuple[int, int, int]]) -> tuple[list[int], list[ImageInput]]:
    """`layout`: text runs (a count) and images (a grid), in order."""
    tokens: list[int] = []
    images = []
    for part in layout:
        if isinstance(part, int):
            tokens += [1] * part
        else:
            images.append(_image(len(tokens), part))
            tokens += [IMAGE] * (part[0] * part[1] * part[2])
    return tokens, images


def _hf_positions(tokens: list[int], images: list[ImageInput]) -> tuple[np.ndarray, int]:
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

    config = transformers.Qwen2_5_VLConfig(
        text_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                     "num_key_value_heads": 1, "vocab_size": 128},
        vision_config={"depth": 1, "hidden_size": 8, "out_hidden_size": 16, "intermediate_size": 8, "num_heads": 1},
        image_token_id=IMAGE,
    )  # fmt: skip
    with torch.device("meta"):
        model = Qwen2_5_VLModel(config)
    ids = torch.tensor([tokens])
    grids = torch.tensor([[t, h * MERGE, w * MERGE] for t, h, w in (i.grid for i in images)]).reshape(-1, 3)
    position_ids, deltas = model.get_rope_index(
        ids, mm_token_type_ids=(ids == IMAGE).int(), image_grid_thw=grids
    )
    return position_ids[:, 0].numpy(), int(deltas)


LAYOUTS = [
    [(1, 2, 3), 5],  # an image at the start, wider than tall
    [4, (1, 3, 2), 6],  # in the middle, taller than wide
    [3, (1, 2, 2), 2, (1, 4, 1), 3],  # two images
    [
        2,
        (1, 1, 1),
        1,
        (1, 2, 5),
    ],  # the last token an image's (transformers cannot tell adjacent images apart)
]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_positions_are_transformers_get_rope_index(layout: list) -> None:
    tokens, images = _prompt(layout)
    expected, delta = _hf_positions(tokens, images)
    got = PositionLayout.of(images)
    assert got is not None
    np.testing.assert_array_equal(got.positions3(0, len(tokens)), expected)
    assert got.final_shift == delta


@pytest.mark.parametrize("layout", LAYOUTS)
def test_any_chunk_has_the_whole_prompts_positions(layout: list) -> None:
    tokens, images = _prompt(layout)
    got = PositionLayout.of(images)
    assert got is not None
    whole = got.positions3(0, len(tokens))
    for start in range(len(tokens)):
        for end in range(start + 1, len(tokens) + 1):
            np.testing.assert_array_equal(got.positions3(start, end), whole[:, start:end])
            if not got.touches_grid(start, end):  # text only: the one position is all three
                np.testing.assert_array_equal(
                    np.arange(start, end) + got.shifts(start, end), whole[0, start:end]
                )


def test_images_without_grid_keep_index_positions() -> None:
    assert PositionLayout.of([]) is None
    assert PositionLayout.of([ImageInput("a", 0, 4, torch.zeros(1, 3, 8, 8))]) is None
    with pytest.raises(ValueError, match="not its grid"):
        PositionLayout.of([ImageInput("a", 0, 5, torch.zeros(16, 8), grid=(1, 2, 2))])


def _scheduled(request: Request, start: int, n: int) -> ScheduledRequest:
    request.num_computed_tokens = start
    return ScheduledRequest(request=request, num_new_tokens=n, block_ids=list(range((start + n + 15) // 16)))


def test_a_step_takes_three_positions_only_where_a_chunk_holds_image_tokens() -> None:
    tokens, images = _prompt([3, (1, 2, 3), 5])
    with_images = Request("a", tokens, SamplingParams(), images=tuple(images))
    text = Request("b", [1] * 7, SamplingParams())
    whole = with_images.position_layout.positions3(0, len(tokens))

    inputs = build_model_inputs(
        [_scheduled(with_images, 0, 6), _scheduled(text, 0, 7)], 16, torch.device("cpu")
    )
    assert inputs.positions.shape == (3, 13)
    np.testing.assert_array_equal(inputs.positions[:, :6].numpy(), whole[:, :6])
    np.testing.assert_array_equal(inputs.positions[:, 6:].numpy(), np.tile(np.arange(7), (3, 1)))

    inputs = build_model_inputs(
        [_scheduled(with_images, 9, 5), _scheduled(text, 0, 7)], 16, torch.device("cpu")
    )
    assert inputs.positions.shape == (12,)  # the chunk after the image: text, shifted
    np.testing.assert_array_equal(inputs.positions[:5].numpy(), whole[0, 9:])
    np.testing.assert_array_equal(inputs.positions[5:].numpy(), np.arange(7))
    # a decode after the prompt goes on from the last prompt position
    assert with_images.decode_shift == whole[0, -1] + 1 - len(tokens)


def test_mrope_tables_are_transformers_and_plain_rope_for_text() -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding

    section = (4, 6, 6)
    config = transformers.Qwen2_5_VLTextConfig(
        hidden_size=64, num_attention_heads=2, rope_parameters={"rope_type": "default", "mrope_section": list(section),
                                                                "rope_theta": 10000.0})  # fmt: skip
    ours = MRotaryEmbedding(32, 10000.0, None, section)
    positions = torch.randint(0, 5000, (3, 11))
    cos, sin = Qwen2_5_VLRotaryEmbedding(config)(torch.zeros(1, dtype=torch.float32), positions[:, None])
    got_cos, got_sin = ours(positions, torch.float32)
    torch.testing.assert_close(got_cos[:, 0], cos[0], rtol=0, atol=0)
    half = 16
    torch.testing.assert_close(got_sin[:, 0, half:], sin[0, :, half:], rtol=0, atol=0)
    torch.testing.assert_close(got_sin[:, 0, :half], -sin[0, :, :half], rtol=0, atol=0)  # ours pre-negated
    text = positions[0]
    for ours_table, plain_table in zip(
        ours(text.expand(3, -1), torch.float32),
        RotaryEmbedding(32, 10000.0)(text, torch.float32),
        strict=True,
    ):
        torch.testing.assert_close(ours_table, plain_table, rtol=0, atol=0)
