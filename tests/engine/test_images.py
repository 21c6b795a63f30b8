"""Image inputs through EngineCore on a tiny random Idefics3 (CPU, fp32 KV): greedy parity with
transformers, chunks that cut an image, prefix-cache hits keyed by the image, the encoder cache,
batches that mix text and image requests, the disk tier across a restart, and both engine clients."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from pathlib import Path

import pytest
import torch
from torch import nn

from kvserve.cli import engine_host
from kvserve.config import KVStoreConfig
from kvserve.engine.client import AsyncEngineClient
from kvserve.engine.client_protocol import EngineClient
from kvserve.engine.core import EngineCore
from kvserve.engine.image_input import ImageInput
from kvserve.engine.kv_cache.block_hash import compute_block_hashes
from kvserve.engine.kv_cache.manager import KVCacheManager
from kvserve.engine.process_client import ProcessEngineClient
from kvserve.engine.request import Request
from kvserve.engine.sampling_params import SamplingParams
from tests.engine.conftest import make_engine
from tests.models.helpers import IMAGE_TOKEN_ID, TILE, SavedIdefics3, save_tiny_idefics3

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
BLOCK = 4
IMG = IMAGE_TOKEN_ID
START, TILE_BREAK, END = 301, 303, 302  # stand-ins for Idefics3's markers around and between tiles


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> SavedIdefics3:
    saved = save_tiny_idefics3(tmp_path_factory.mktemp("idefics3-engine"))
    saved.hf.generation_config.eos_token_id = None  # the engine's tiny models have no EOS either
    saved.hf.generation_config.pad_token_id = 0
    return saved


def _engine(path: Path, **overrides) -> EngineCore:
    options = {"block_size": BLOCK, "max_num_seqs": 4, "kv_dtype": "float32"} | overrides
    return make_engine(path, **options)


def _text(n: int, seed: int) -> list[int]:
    return torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _pixels(num_tiles: int, seed: int) -> torch.Tensor:
    return torch.randn(num_tiles, 3, TILE, TILE, generator=torch.Generator().manual_seed(seed))


def _image(prompt: list[int], offset: int, num_tiles: int, seed: int, name: str | None = None) -> ImageInput:
    """An image of `num_tiles` tiles whose placeholders start at `offset` (tiles after the first begin
    with a TILE_BREAK marker, as Idefics3's <row_i_col_j> do)."""
    num_tokens = num_tiles * 4 + (num_tiles - 1)
    assert prompt[offset] == IMG and prompt[offset + num_tokens - 1] == IMG
    return ImageInput(name or f"image-{seed}", offset, num_tokens, _pixels(num_tiles, seed))


def _image_tokens(num_tiles: int) -> list[int]:
    tiles = [[IMG] * 4 for _ in range(num_tiles)]
    return [START, *tiles[0], *(t for tile in tiles[1:] for t in [TILE_BREAK, *tile]), END]


def _two_image_prompt(seed: int) -> tuple[list[int], list[ImageInput]]:
    """Text, a 2-tile image (span [11, 20)), text, a 1-tile image (span [30, 34)), text: 41 tokens."""
    prompt = _text(10, seed) + _image_tokens(2) + _text(8, seed + 1) + _image_tokens(1) + _text(6, seed + 2)
    return prompt, [_image(prompt, 11, 2, seed + 10), _image(prompt, 30, 1, seed + 11)]


def _run(
    engine: EngineCore, prompt: list[int], images=(), request_id: str = "r"
) -> tuple[list[int], Request]:
    request = engine.make_request(request_id, prompt, GREEDY, images=images)
    outputs = engine.generate([request])[request_id]
    return [t for o in outputs for t in o.new_token_ids], request


def _hf_greedy(hf: nn.Module, prompt: list[int], images: list[ImageInput]) -> list[int]:
    pixels = torch.cat([image.pixel_values for image in images])[None]  # each tile an HF "image"
    with torch.no_grad():
        out = hf.generate(
            input_ids=torch.tensor([prompt]),
            pixel_values=pixels,
            max_new_tokens=8,
            min_new_tokens=8,
            do_sample=False,
        )
    return out[0, len(prompt) :].tolist()


def test_greedy_with_images_matches_transformers(saved: SavedIdefics3) -> None:
    prompt, images = _two_image_prompt(seed=1)
    tokens, _ = _run(_engine(saved.path), prompt, images)
    assert tokens == _hf_greedy(saved.hf, prompt, images)


@pytest.mark.parametrize("budget", [5, 7, 13])
def test_chunks_that_cut_images_give_the_one_chunk_tokens(saved: SavedIdefics3, budget: int) -> None:
    prompt, images = _two_image_prompt(seed=2)
    one_chunk, _ = _run(_engine(saved.path), prompt, images)
    chunked, _ = _run(_engine(saved.path, max_num_batched_tokens=budget), prompt, images)
    assert chunked == one_chunk


def test_same_image_hits_the_prefix_cache_past_the_image(saved: SavedIdefics3) -> None:
    engine = _engine(saved.path)
    prompt, images = _two_image_prompt(seed=3)
    first, _ = _run(engine, prompt, images, "a")
    again, request = _run(engine, prompt, images, "b")
    assert request.num_cached_tokens == (len(prompt) - 1) // BLOCK * BLOCK > images[-1].end
    assert again == first


def test_another_image_stops_the_hit_at_its_first_block(saved: SavedIdefics3) -> None:
    engine = _engine(saved.path)
    prompt, images = _two_image_prompt(seed=4)
    _run(engine, prompt, images, "a")
    for changed in (
        [_image(prompt, 11, 2, seed=99), images[1]],  # other pixels, other hash
        [ImageInput("another-hash", 11, 9, images[0].pixel_values), images[1]],  # same pixels, other hash
    ):
        tokens, request = _run(engine, prompt, changed, f"b-{changed[0].content_hash}")
        assert request.num_cached_tokens == 11 // BLOCK * BLOCK
        assert tokens == _run(_engine(saved.path), prompt, changed)[0]
    second_changed = [images[0], _image(prompt, 30, 1, seed=98)]
    _, request = _run(engine, prompt, second_changed, "c")
    assert request.num_cached_tokens == 30 // BLOCK * BLOCK


def test_text_only_block_hashes_are_the_plain_chain_hashes(saved: SavedIdefics3) -> None:
    engine = _engine(saved.path)
    prompt, images = _two_image_prompt(seed=5)
    text_only = engine.make_request("t", prompt, GREEDY)  # the same tokens without images
    plain = compute_block_hashes(prompt, BLOCK, engine.cache_key)
    assert engine.kv_manager.block_hashes(text_only) == plain
    with_images = engine.kv_manager.block_hashes(engine.make_request("i", prompt, GREEDY, images=images))
    first_image_block = images[0].offset // BLOCK
    assert with_images[:first_image_block] == plain[:first_image_block]
    assert all(
        a != b for a, b in zip(with_images[first_image_block:], plain[first_image_block:], strict=True)
    )


def test_encoder_cache_serves_a_resent_image(saved: SavedIdefics3) -> None:
    engine = _engine(saved.path)
    prompt, images = _two_image_prompt(seed=6)
    _run(engine, prompt, images, "a")
    assert engine.encoder_cache is not None
    before = engine.encoder_cache.stats()
    assert (before.num_hits, before.num_misses, before.num_entries) == (0, 2, 2)
    # Another first turn with the same images: the prompt differs from its first block, so the image
    # tokens are computed again, from the kept rows.
    other = _text(10, seed=60) + prompt[10:]
    tokens, request = _run(engine, other, images, "b")
    after = engine.encoder_cache.stats()
    assert request.num_cached_tokens == 0
    assert (after.num_hits, after.num_misses) == (2, 2)
    reported = engine_host.engine_stats(engine).encoder_cache  # what /metrics reads
    assert reported is not None and dataclasses.astuple(reported) == dataclasses.astuple(after)
    assert tokens == _run(_engine(saved.path), other, images)[0]


class _CountingTiles:
    """A PixelSource that counts how often the engine makes its tiles."""

    def __init__(self, pixels: torch.Tensor) -> None:
        self.pixels, self.made = pixels, 0

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.pixels.shape)

    def tensor(self) -> torch.Tensor:
        self.made += 1
        return self.pixels


def test_tiles_are_made_only_when_the_encoder_cache_lacks_the_image(saved: SavedIdefics3) -> None:
    """What the front end sends is the encoded image (TiledImage): tiling it (0.1-0.35 s for a
    SmolVLM image) is the engine's, once per encoding; a resent image costs no tiling."""
    engine = _engine(saved.path)
    prompt, images = _two_image_prompt(seed=8)
    sources = [_CountingTiles(image.pixel_values) for image in images]
    lazy = [
        ImageInput(i.content_hash, i.offset, i.num_tokens, s) for i, s in zip(images, sources, strict=True)
    ]
    tokens, _ = _run(engine, prompt, lazy, "a")
    assert [s.made for s in sources] == [1, 1]
    other = _text(10, seed=80) + prompt[10:]
    _run(engine, other, lazy, "b")
    assert [s.made for s in sources] == [1, 1]
    assert tokens == _run(_engine(saved.path), prompt, images)[0]


def test_a_step_mixing_text_and_image_requests_gives_each_its_solo_tokens(saved: SavedIdefics3) -> None:
    image_prompt, images = _two_image_prompt(seed=7)
    # The text request holds an image token typed as text: it keeps its own embedding, no image row.
    text_prompt = _text(12, seed=70) + [IMG] + _text(9, seed=71)
    engine = _engine(saved.path)
    engine.add_request(text := engine.make_request("text", text_prompt, GREEDY))
    engine.add_request(image := engine.make_request("image", image_prompt, GREEDY, images=images))
    together: dict[str, list[int]] = {"text": [], "image": []}
    first_step = True
    while engine.has_unfinished_requests():
        for output in engine.step():
            together[output.request_id] += output.new_token_ids
        if first_step:  # both prompts went through the one forward
            assert (text.num_computed_tokens, image.num_computed_tokens) == (
                len(text_prompt),
                len(image_prompt),
            )
            first_step = False
    assert together["text"] == _run(_engine(saved.path), text_prompt)[0]
    assert together["image"] == _run(_engine(saved.path), image_prompt, images)[0]


def test_preempted_image_requests_recompute_the_same_tokens(saved: SavedIdefics3) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    prompts = [_two_image_prompt(seed=20 + 3 * i) for i in range(3)]

    def run(engine: EngineCore) -> tuple[list[list[int]], list[Request]]:
        requests = [
            engine.make_request(f"r{i}", p, params, images=images) for i, (p, images) in enumerate(prompts)
        ]
        outputs = engine.generate(requests)
        return [[t for o in outputs[r.request_id] for t in o.new_token_ids] for r in requests], requests

    roomy, _ = run(_engine(saved.path))
    # 3 x 71 tokens need 54 blocks of 4: with 30, requests preempt each other and prefill again.
    tight = _engine(saved.path)
    tight.kv_manager = tight.scheduler.kv = KVCacheManager(BLOCK, 30, extra_key=tight.cache_key)
    tokens, requests = run(tight)
    assert sum(r.num_preemptions for r in requests) > 0
    assert tokens == roomy


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("off_placeholder", "must start and end on an image token"),
        ("too_few_rows", "spans 8 image tokens but its pixels give 4 rows"),
        ("overlapping", "in prompt order"),
        ("past_the_end", "inside the prompt"),
        ("not_square", "squares"),
    ],
)
def test_bad_images_are_refused_before_queueing(saved: SavedIdefics3, case: str, message: str) -> None:
    engine = _engine(saved.path)
    prompt, (a, b) = _two_image_prompt(seed=9)
    images = {
        "off_placeholder": [ImageInput("x", 10, 9, a.pixel_values), b],
        "too_few_rows": [ImageInput("x", 11, 9, _pixels(1, 0)), b],
        "overlapping": [a, ImageInput("x", 19, 4, _pixels(1, 0))],
        "past_the_end": [a, ImageInput("x", 40, 9, _pixels(2, 0))],
        "not_square": [a, ImageInput("x", 30, 4, torch.zeros(1, 3, TILE, TILE // 2))],
    }[case]
    with pytest.raises(ValueError, match=message):
        engine.make_request("r", prompt, GREEDY, images=images)


def test_a_text_model_refuses_images(tiny_llama_dir: Path) -> None:
    engine = make_engine(tiny_llama_dir)
    with pytest.raises(ValueError, match="takes no images"):
        engine.make_request("r", [IMG] * 4, GREEDY, images=[ImageInput("x", 0, 4, _pixels(1, 0))])


def test_image_kv_from_disk_after_a_restart_only_for_the_same_image(
    saved: SavedIdefics3, tmp_path: Path
) -> None:
    """The disk tier keys its chunks by the same image-aware chain hashes, in a fresh engine too."""
    store = KVStoreConfig(
        directory=str(tmp_path / "kv"), chunk_tokens=8, min_tokens=8, align_tokens=8, preload_fraction=0.0
    )
    prompt, images = _two_image_prompt(seed=10)
    first = _engine(saved.path, kv_store=store)
    _run(first, prompt, images)
    first.shutdown()

    restarted = _engine(saved.path, kv_store=store)
    assert restarted.disk_tier is not None
    changed = [images[0], _image(prompt, 30, 1, seed=97)]
    _, request = _run(restarted, prompt, changed, "other-image")
    assert request.num_cached_tokens == 30 // 8 * 8  # the chunks before the changed image's
    restarted.shutdown()

    again = _engine(saved.path, kv_store=store)
    tokens, request = _run(again, prompt, images, "same-image")
    assert request.num_cached_tokens == (len(prompt) - 1) // 8 * 8 > images[-1].end
    assert again.disk_tier is not None and again.disk_tier.stats().num_hits == 1
    assert tokens == _run(_engine(saved.path), prompt, images)[0]
    again.shutdown()


def test_the_same_text_with_another_image_is_its_own_checkpoint(saved: SavedIdefics3, tmp_path: Path) -> None:
    """A checkpoint's id is its text's hash, and two image prompts can render to the same text: the
    images' hashes name the checkpoint too, so the second is stored, not skipped as a duplicate,
    and after a restart each image's prompt comes whole from disk."""
    store = KVStoreConfig(
        directory=str(tmp_path / "kv"), chunk_tokens=8, min_tokens=8, align_tokens=8, preload_fraction=0.0
    )
    prompt, images = _two_image_prompt(seed=12)
    changed = [images[0], _image(prompt, 30, 1, seed=98)]
    first = _engine(saved.path, kv_store=store)
    one = SamplingParams(temperature=0.0, max_tokens=1)  # the saved tokens are the prompt's alone
    first.generate([first.make_request("a", prompt, one, images=images)])
    first.generate([first.make_request("b", prompt, one, images=changed)])
    first.shutdown()
    for name, which in (("same", images), ("changed", changed)):
        engine = _engine(saved.path, kv_store=store)
        _, request = _run(engine, prompt, which, name)
        assert request.num_cached_tokens == (len(prompt) - 1) // 8 * 8 > which[-1].end, name
        engine.shutdown()


@pytest.mark.parametrize("transport", ["thread", "process"])
def test_images_reach_the_engine_through_either_client(saved: SavedIdefics3, transport: str) -> None:
    prompt, images = _two_image_prompt(seed=11)
    expected = _run(_engine(saved.path), prompt, images)[0]
    client: EngineClient
    if transport == "thread":
        client = AsyncEngineClient(_engine(saved.path))
    else:  # the pixels cross the pipe pickled (ImageInput.__reduce__)
        client = ProcessEngineClient(functools.partial(_engine, saved.path), start_timeout=600)

    async def tokens() -> list[int]:
        return [t async for o in client.generate("r", prompt, GREEDY, images=images) for t in o.new_token_ids]

    try:
        assert asyncio.run(tokens()) == expected
    finally:
        client.shutdown()
