"""Parity with transformers on tiny random-weight models, in fp32, through the paged cache."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from torch import nn

from kvserve.models.loader.safetensors import load_hf_model
from tests.models.helpers import PagedDriver, save_tiny_hf_model

FAMILIES = ["llama", "llama_tied", "llama_yarn", "qwen2", "qwen2_linear", "qwen3", "gemma3"]
LOGITS_ATOL = 1e-4  # measured max |diff| is ~4e-6 on logits of magnitude ~3
PROMPT_LEN = 40  # > 4x gemma3's window of 8, so sliding layers really drop keys


class Pair(NamedTuple):
    hf: nn.Module
    ours: nn.Module


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Pair:
    path: Path = tmp_path_factory.mktemp(request.param)
    hf = save_tiny_hf_model(request.param, path)
    return Pair(hf, load_hf_model(path, torch.float32).model)


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 384, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _hf_logits(hf: nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()  # [len(tokens), vocab]


def test_prefill_logits_match_hf(pair: Pair) -> None:
    prompt = _tokens(PROMPT_LEN, seed=1)
    logits = PagedDriver(pair.ours).step([(0, prompt)])
    torch.testing.assert_close(logits, _hf_logits(pair.hf, prompt), atol=LOGITS_ATOL, rtol=0)


def test_decode_steps_match_hf(pair: Pair) -> None:
    """Teacher-forced decode: every step's logits against HF's full forward at that position."""
    tokens = _tokens(PROMPT_LEN, seed=2)
    driver = PagedDriver(pair.ours, seed=5)
    steps = [driver.step([(0, tokens[:20])])[-1]]
    steps += [driver.step([(0, [t])])[-1] for t in tokens[20:-1]]
    expected = _hf_logits(pair.hf, tokens)[19:-1]
    torch.testing.assert_close(torch.stack(steps), expected, atol=LOGITS_ATOL, rtol=0)


def test_greedy_generation_matches_hf(pair: Pair) -> None:
    prompt = _tokens(PROMPT_LEN, seed=3)
    ids = torch.tensor([prompt])
    # An explicit mask: generate() would otherwise treat prompt tokens equal to pad_token_id as padding.
    out = pair.hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
    expected = out[0, PROMPT_LEN:]
    assert PagedDriver(pair.ours, seed=7).generate(0, prompt, 24) == expected.tolist()


def test_chunked_prefill_matches_hf(pair: Pair) -> None:
    prompt = _tokens(PROMPT_LEN, seed=4)
    driver = PagedDriver(pair.ours, seed=9)
    chunks = [prompt[:13], prompt[13:27], prompt[27:]]  # later chunks start mid-block (block_size 4)
    logits = torch.cat([driver.step([(0, chunk)]) for chunk in chunks])
    torch.testing.assert_close(logits, _hf_logits(pair.hf, prompt), atol=LOGITS_ATOL, rtol=0)


def test_mixed_batch_matches_separate_runs(pair: Pair) -> None:
    """Two decodes of different lengths + one prefill chunk with context, in one forward."""
    a, b, c = _tokens(31, seed=5), _tokens(18, seed=6), _tokens(37, seed=7)
    driver = PagedDriver(pair.ours, seed=11)
    driver.step([(0, a[:-1]), (1, b[:-1]), (2, c[:20])])
    batched = driver.step([(0, a[-1:]), (1, b[-1:]), (2, c[20:])])
    expected = torch.cat(
        [_hf_logits(pair.hf, a)[-1:], _hf_logits(pair.hf, b)[-1:], _hf_logits(pair.hf, c)[20:]]
    )
    torch.testing.assert_close(batched, expected, atol=LOGITS_ATOL, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["torch_ref", "triton"])
@pytest.mark.parametrize("family", ["llama", "llama_yarn", "qwen3", "gemma3", "gemma3_hd256"])
def test_cuda_matches_cpu(family: str, backend: str, tmp_path: Path) -> None:
    hf = save_tiny_hf_model(family, tmp_path)
    prompt = _tokens(PROMPT_LEN, seed=8)
    expected = _hf_logits(hf, prompt)
    ours = load_hf_model(tmp_path, torch.float32, device="cuda").model
    if backend == "triton":  # sliding windows (gemma3) and q/k norms (qwen3) through the kernels
        from kvserve.models.layers.attention.triton_backend import TritonBackend

        ours.set_attention_backend(TritonBackend())
    driver = PagedDriver(ours)
    logits = torch.cat([driver.step([(0, prompt[:25])]), *(driver.step([(0, [t])]) for t in prompt[25:])])
    torch.testing.assert_close(logits, expected, atol=1e-3, rtol=0)  # cuBLAS may use TF32
    ours_bf16 = load_hf_model(tmp_path, torch.bfloat16, device="cuda").model
    assert PagedDriver(ours_bf16).generate(0, prompt, 8)  # bf16 runs end to end on CUDA
