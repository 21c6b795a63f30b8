"""Idefics3 / SmolVLM parity with transformers on a tiny random-weight model, in fp32: the vision
tower and connector alone, and the decoder's logits over prompts with images, through the paged
cache."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from torch import nn

from kvserve.models.loader.safetensors import load_hf_model
from kvserve.models.vision.merge import ImageTokenMismatchError
from tests.models.helpers import (
    IMAGE_TOKEN_ID,
    TILE,
    TOKENS_PER_TILE,
    PagedDriver,
    SavedIdefics3,
    save_tiny_idefics3,
)

LOGITS_ATOL = 1e-4
HIDDEN_ATOL = 1e-5


class Pair(NamedTuple):
    hf: nn.Module
    ours: nn.Module


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> SavedIdefics3:
    return save_tiny_idefics3(tmp_path_factory.mktemp("idefics3"))


@pytest.fixture(scope="module")
def pair(saved: SavedIdefics3) -> Pair:
    return Pair(saved.hf, load_hf_model(saved.path, torch.float32).model)


def _pixels(num_tiles: int, seed: int, height: int = TILE, width: int = TILE) -> torch.Tensor:
    return torch.randn(num_tiles, 3, height, width, generator=torch.Generator().manual_seed(seed))


def _text(n: int, seed: int) -> list[int]:
    return torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _prompt(layout: str, seed: int) -> list[int]:
    """`layout`: T for 5 text tokens, I for one tile's image tokens wrapped in text markers."""
    tokens: list[int] = []
    for i, part in enumerate(layout):
        tokens += _text(5, seed + i) if part == "T" else [301, *[IMAGE_TOKEN_ID] * TOKENS_PER_TILE, 302]
    return tokens


def _hf_logits(hf: nn.Module, tokens: list[int], pixels: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=torch.tensor([tokens]), pixel_values=pixels[None]).logits[0].float()


def _our_embeds(ours: nn.Module, tokens: list[int], pixels: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        rows = ours.encode_images(pixels).reshape(-1, ours.arch.hidden_size)  # [num_image_tokens, hidden]
        return ours.embed_inputs(torch.tensor(tokens), rows)


@pytest.mark.parametrize(("width", "height"), [(TILE, TILE), (16, 24), (8, 8)])
def test_vision_encoder_matches_hf(pair: Pair, width: int, height: int) -> None:
    """Tiles smaller than `image_size` and not square look up the position table by bucket."""
    pixels = _pixels(2, seed=1, height=height, width=width)
    with torch.no_grad():
        expected = pair.hf.model.vision_model(pixel_values=pixels).last_hidden_state
        got = pair.ours.vision_model(pixels)
    torch.testing.assert_close(got, expected, atol=HIDDEN_ATOL, rtol=0)


def test_encoder_and_connector_match_hf(pair: Pair) -> None:
    pixels = _pixels(3, seed=2)
    with torch.no_grad():
        features = pair.hf.model.get_image_features(pixels[None], return_dict=True).pooler_output
        got = pair.ours.encode_images(pixels)
    assert got.shape == (3, TOKENS_PER_TILE, 64)
    torch.testing.assert_close(got.reshape(-1, 64), torch.cat(features), atol=HIDDEN_ATOL, rtol=0)


@pytest.mark.parametrize("layout", ["IT", "TIT", "TITIT"], ids=["start", "middle", "two_images"])
def test_prefill_logits_match_hf(pair: Pair, layout: str) -> None:
    tokens = _prompt(layout, seed=3)
    pixels = _pixels(layout.count("I"), seed=4)
    embeds = _our_embeds(pair.ours, tokens, pixels)
    logits = PagedDriver(pair.ours).step([(0, tokens)], inputs_embeds=embeds)
    torch.testing.assert_close(logits, _hf_logits(pair.hf, tokens, pixels), atol=LOGITS_ATOL, rtol=0)


def test_chunks_that_cut_an_image_then_decode_match_hf(pair: Pair) -> None:
    """Prefill in chunks whose boundaries fall inside image spans, then text decode steps by id."""
    tokens = _prompt("TITIT", seed=5)
    pixels = _pixels(2, seed=6)
    embeds = _our_embeds(pair.ours, tokens, pixels)
    driver = PagedDriver(pair.ours, seed=3)
    cuts = [0, 8, 15, len(tokens) - 3]  # 8 and 15: inside the first and second image
    logits = [driver.step([(0, tokens[a:b])], inputs_embeds=embeds[a:b]) for a, b in itertools.pairwise(cuts)]
    logits += [driver.step([(0, [t])]) for t in tokens[-3:]]
    torch.testing.assert_close(
        torch.cat(logits), _hf_logits(pair.hf, tokens, pixels), atol=LOGITS_ATOL, rtol=0
    )


def test_text_only_prompt_runs_as_llama(pair: Pair) -> None:
    tokens = _text(12, seed=7)
    with torch.no_grad():
        expected = pair.hf(input_ids=torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(PagedDriver(pair.ours).step([(0, tokens)]), expected, atol=LOGITS_ATOL, rtol=0)


def test_image_rows_must_match_placeholders(pair: Pair) -> None:
    tokens = _prompt("TI", seed=8)
    rows = torch.zeros(TOKENS_PER_TILE - 1, 64)
    with pytest.raises(ImageTokenMismatchError, match="4 image tokens in the prompt but 3 image rows"):
        pair.ours.embed_inputs(torch.tensor(tokens), rows)


def _save_word_tokenizer(path: Path) -> None:
    """A word-level tokenizer over the tiny vocabulary, so that `load_model` finds one."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(IMAGE_TOKEN_ID)} | {"<image>": IMAGE_TOKEN_ID}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="w1").save_pretrained(str(path))


def test_load_model_builds_the_vision_model_from_the_folder(saved: SavedIdefics3) -> None:
    from kvserve.models.idefics3 import Idefics3ForConditionalGeneration
    from kvserve.models.loader import load_model

    _save_word_tokenizer(saved.path)
    loaded = load_model(saved.path, torch.float32, progress=False)
    assert isinstance(loaded.model, Idefics3ForConditionalGeneration)
    arch, vision = loaded.arch, loaded.arch.vision
    assert (arch.architecture, arch.hidden_size, arch.rms_norm_eps, arch.tie_word_embeddings) == (
        "idefics3", 64, 1e-5, False,
    )  # fmt: skip
    assert vision is not None and (vision.image_token_id, vision.tokens_per_tile) == (IMAGE_TOKEN_ID, 4)
    assert loaded.tokenizer.tokenizer.convert_tokens_to_ids("<image>") == IMAGE_TOKEN_ID
    tokens, pixels = _prompt("TIT", seed=9), _pixels(1, seed=10)
    logits = PagedDriver(loaded.model).step([(0, tokens)], _our_embeds(loaded.model, tokens, pixels))
    torch.testing.assert_close(logits, _hf_logits(saved.hf, tokens, pixels), atol=LOGITS_ATOL, rtol=0)
