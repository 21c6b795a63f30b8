"""Qwen2.5-VL through the engine (M-RoPE positions, the windowed tower, the paged cache), against
transformers on a tiny random-weight model in fp32: greedy tokens and their logprobs, chunks that cut
images, prefix-cache hits past an image, a text-only prompt."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from kvserve.engine.core import EngineCore
from kvserve.engine.image_input import ImageInput
from kvserve.engine.sampling_params import SamplingParams
from tests.engine.conftest import make_engine
from tests.models.tiny_qwen_vl import save_tiny_qwen_vl

transformers = pytest.importorskip("transformers")

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3)
MERGE, PATCH_DIM = 2, 3 * 2 * 4 * 4  # the tiny tower: 4-pixel patches, 2 frames, merged 2 x 2


class Saved:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.hf = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
            str(path), dtype=torch.float32
        )
        self.hf.eval()
        self.hf.generation_config.eos_token_id = None
        self.hf.generation_config.pad_token_id = 0
        config = self.hf.config
        self.image, self.start, self.end = (
            config.image_token_id,
            config.vision_start_token_id,
            config.vision_end_token_id,
        )


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Saved:
    return Saved(save_tiny_qwen_vl(tmp_path_factory.mktemp("qwen-vl-engine")))


def _engine(path: Path, **overrides) -> EngineCore:
    return make_engine(path, **({"block_size": 4, "max_num_seqs": 4, "kv_dtype": "float32"} | overrides))


def _text(n: int, seed: int) -> list[int]:
    return torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _prompt(saved: Saved, layout: list, seed: int) -> tuple[list[int], list[ImageInput]]:
    """`layout`: text runs (a count) and images (an (h, w) token grid), in order."""
    tokens: list[int] = []
    images = []
    for i, part in enumerate(layout):
        if isinstance(part, int):
            tokens += _text(part, seed + i)
            continue
        h, w = part
        tokens.append(saved.start)
        pixels = torch.randn(
            h * w * MERGE**2, PATCH_DIM, generator=torch.Generator().manual_seed(seed + 100 + i)
        )
        images.append(ImageInput(f"img-{seed}-{i}", len(tokens), h * w, pixels, grid=(1, h, w)))
        tokens += [saved.image] * (h * w) + [saved.end]
    return tokens, images


def _run(engine: EngineCore, prompt: list[int], images, request_id: str = "r"):
    request = engine.make_request(request_id, prompt, GREEDY, images=images)
    outputs = engine.generate([request])[request_id]
    return [t for o in outputs for t in o.new_token_ids], request


def _hf(saved: Saved, prompt: list[int], images: list[ImageInput]) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy tokens and the log-softmax of each step's logits."""
    ids = torch.tensor([prompt])
    kwargs = {"input_ids": ids, "mm_token_type_ids": (ids == saved.image).int()}
    if images:
        kwargs["pixel_values"] = torch.cat([i.pixel_values for i in images])
        kwargs["image_grid_thw"] = torch.tensor(
            [(t, h * MERGE, w * MERGE) for t, h, w in (i.grid for i in images)]
        )
    with torch.no_grad():
        out = saved.hf.generate(**kwargs, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                                output_scores=True, return_dict_in_generate=True)  # fmt: skip
    logprobs = torch.stack(out.scores)[:, 0].float().log_softmax(-1)  # [steps, vocab]
    return out.sequences[0, len(prompt) :].tolist(), logprobs


LAYOUTS = {
    "start": [(2, 3), 6],
    "middle": [5, (3, 2), 4],
    "two_images": [4, (2, 2), 3, (1, 4), 5],
}


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_greedy_and_logprobs_match_transformers(saved: Saved, layout: list) -> None:
    prompt, images = _prompt(saved, layout, seed=1)
    tokens, request = _run(_engine(saved.path), prompt, images)
    expected, logprobs = _hf(saved, prompt, images)
    assert tokens == expected
    for step, lp in enumerate(request.output_logprobs):  # the sampled token's and the top 3
        for token_id, value in ((lp.token_id, lp.logprob), *lp.top):
            assert math.isclose(value, logprobs[step, token_id].item(), abs_tol=1e-4)


@pytest.mark.parametrize("budget", [5, 9])
def test_chunks_that_cut_images_give_the_one_chunk_tokens(saved: Saved, budget: int) -> None:
    prompt, images = _prompt(saved, LAYOUTS["two_images"], seed=2)
    whole, _ = _run(_engine(saved.path), prompt, images)
    chunked, _ = _run(_engine(saved.path, max_num_batched_tokens=budget), prompt, images)
    assert chunked == whole


def test_a_hit_past_an_image_goes_on_at_the_shifted_positions(saved: Saved) -> None:
    """The second request shares the first's image and text and then continues: its suffix runs
    at positions after the image's grid, not its token count."""
    engine = _engine(saved.path)
    prompt, images = _prompt(saved, [3, (3, 3), 9], seed=3)
    _run(engine, prompt, images, "a")
    longer = prompt + _text(7, seed=4)
    tokens, request = _run(engine, longer, images, "b")
    assert request.num_cached_tokens >= len(prompt) - 4
    assert tokens == _hf(saved, longer, images)[0]


def test_text_only_prompt_matches_transformers(saved: Saved) -> None:
    prompt = _text(15, seed=5)
    tokens, _ = _run(_engine(saved.path), prompt, [])
    assert tokens == _hf(saved, prompt, [])[0]


def test_images_must_carry_a_grid_that_fits_their_patches(saved: Saved) -> None:
    engine = _engine(saved.path)
    prompt, images = _prompt(saved, [3, (2, 2), 3], seed=6)
    image = images[0]
    no_grid = ImageInput(image.content_hash, image.offset, image.num_tokens, image.pixel_values)
    with pytest.raises(ValueError, match="needs its token grid"):
        engine.make_request("x", prompt, GREEDY, images=[no_grid])
    wrong = ImageInput(
        image.content_hash, image.offset, image.num_tokens, image.pixel_values[:-1], grid=(1, 2, 2)
    )
    with pytest.raises(ValueError, match="takes patches of shape"):
        engine.make_request("y", prompt, GREEDY, images=[wrong])


def test_low_bit_weights_quantize_the_decoder_and_leave_the_tower_dense(saved: Saved) -> None:
    from kvserve.models.layers.quant import WeightOnlyLinear

    engine = _engine(saved.path, weight_quant="int8")
    model = engine.loaded.model
    assert any(isinstance(m, WeightOnlyLinear) for m in model.model.modules())
    assert not any(isinstance(m, WeightOnlyLinear) for m in model.visual.modules())
    prompt, images = _prompt(saved, LAYOUTS["middle"], seed=7)
    tokens, _ = _run(engine, prompt, images)
    assert len(tokens) == GREEDY.max_tokens


def test_loading_recomputes_the_towers_rotary_table(saved: Saved) -> None:
    """The model is built on the meta device and moved with `to_empty`: the loader fills parameters
    only, so a buffer not recomputed holds whatever memory it got (garbage rows, now and then NaN)."""
    from kvserve.models.loader.safetensors import load_hf_model
    from kvserve.models.vision.qwen2_5_vl_vision import VisionRotary

    for _ in range(3):  # other allocations each time
        model = load_hf_model(saved.path, torch.float32).model
        tables = [m for m in model.visual.modules() if isinstance(m, VisionRotary)]
        assert tables
        for table in tables:
            torch.testing.assert_close(table.inv_freq, VisionRotary(model.vision).inv_freq, rtol=0, atol=0)
