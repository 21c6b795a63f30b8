"""csrc/prefill_attention.cpp (attention/cpu_prefill.py): one sequence's prompt rows over its paged
KV, against attention written from the definition; bit for bit the same rows whatever the chunking."""

from __future__ import annotations

import pytest
import torch

from kvserve.models.layers import cpu_ext
from kvserve.models.layers.attention.cpu_prefill import CpuPrefillKernel

pytestmark = pytest.mark.skipif(cpu_ext.load() is None, reason="the CPU kernels do not build here")

KV_HEADS, GROUP, DIM, BLOCK_SIZE = 3, 3, 64, 16
FAST_BF16 = CpuPrefillKernel.for_dtype(torch.bfloat16) is not None  # AMX or AVX512-BF16


def _sequence(
    n: int, cache_dtype: torch.dtype, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q [n, heads, dim], cache, block table): n tokens' KV in shuffled blocks; every other slot of
    the cache holds NaN, so a read of a slot outside the sequence shows in the output."""
    gen = torch.Generator().manual_seed(seed)
    num_blocks = -(-n // BLOCK_SIZE)
    cache = torch.full((2, num_blocks * 2 + 3, BLOCK_SIZE, KV_HEADS, DIM), float("nan"))
    table = torch.randperm(cache.shape[1], generator=gen)[:num_blocks]
    pos = torch.arange(n)
    slots = table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE
    kv = torch.randn(2, n, KV_HEADS, DIM, generator=gen)
    cache.view(2, -1, KV_HEADS, DIM)[:, slots] = kv
    q = torch.randn(n, KV_HEADS * GROUP, DIM, generator=gen)
    return q, cache.to(cache_dtype), table


def _dense(q: torch.Tensor, cache: torch.Tensor, table: torch.Tensor, window: int | None) -> torch.Tensor:
    """Attention from the definition, in float64, over the KV as the cache stores it."""
    n = q.shape[0]
    pos = torch.arange(n)
    slots = table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE
    k, v = (cache[i].reshape(-1, KV_HEADS, DIM)[slots].double().repeat_interleave(GROUP, 1) for i in (0, 1))
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * DIM**-0.5
    visible = pos[None, :] <= pos[:, None]
    if window is not None:
        visible &= pos[:, None] - pos[None, :] < window
    return torch.einsum("hqk,khd->qhd", scores.masked_fill(~visible, float("-inf")).softmax(-1), v)


def _chunked(
    kernel: CpuPrefillKernel,
    q: torch.Tensor,
    cache: torch.Tensor,
    table: torch.Tensor,
    cuts: list[int],
    window: int | None,
) -> torch.Tensor:
    """Every row's output, computed in calls of `cuts` rows (each after the earlier ones' KV)."""
    outputs, start = [], 0
    for size in cuts:
        table_now = table[: -(-(start + size) // BLOCK_SIZE)]
        outputs.append(kernel(q[start : start + size], cache, table_now, start, DIM**-0.5, window))
        start += size
    return torch.cat(outputs)


CUTS = [[300], [1, 299], [17, 128, 1, 154], [256, 44], [129, 127, 44]]


@pytest.mark.parametrize("window", [None, 40])
@pytest.mark.parametrize("cache_dtype", [torch.float16, torch.float32], ids=["kv16", "kv32"])
def test_fp32_matches_the_definition_and_does_not_depend_on_chunking(
    cache_dtype: torch.dtype, window: int | None
) -> None:
    q, cache, table = _sequence(300, cache_dtype)
    kernel = CpuPrefillKernel.for_dtype(torch.float32)
    assert kernel is not None
    whole = _chunked(kernel, q, cache, table, CUTS[0], window)
    assert whole.dtype == torch.float32 and torch.isfinite(whole).all()
    torch.testing.assert_close(whole.double(), _dense(q, cache, table, window), atol=2e-6, rtol=1e-5)
    for cuts in CUTS[1:]:
        assert torch.equal(_chunked(kernel, q, cache, table, cuts, window), whole), cuts


@pytest.mark.parametrize("window", [None, 40])
def test_bf16_matches_the_definition_within_bf16_rounding(window: int | None) -> None:
    """bf16 operands (q, K, V and the probabilities rounded to bf16, sums in fp32); on CPUs without
    AMX or AVX512-BF16 the kernel is not chosen by the engine, but its row-major layout runs here
    all the same."""
    q, cache, table = _sequence(300, torch.float16, seed=1)
    kernel = CpuPrefillKernel(torch.bfloat16)
    kernel.vnni = FAST_BF16  # the VNNI operand layout only where the CPU has bf16 dot products
    out = _chunked(kernel, q, cache, table, [300], window)
    torch.testing.assert_close(out.double(), _dense(q, cache, table, window), atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not FAST_BF16, reason="bf16 prompt attention runs in the kernel on AMX or AVX512-BF16")
@pytest.mark.parametrize("window", [None, 40])
def test_bf16_does_not_depend_on_chunking(window: int | None) -> None:
    q, cache, table = _sequence(300, torch.float16, seed=2)
    kernel = CpuPrefillKernel.for_dtype(torch.bfloat16)
    assert kernel is not None
    whole = _chunked(kernel, q, cache, table, CUTS[0], window)
    for cuts in CUTS[1:]:
        assert torch.equal(_chunked(kernel, q, cache, table, cuts, window), whole), cuts


def test_bad_inputs_are_refused_not_read_out_of_bounds() -> None:
    q, cache, table = _sequence(40, torch.float16)
    ext = cpu_ext.load()
    q4 = q.view(40, KV_HEADS, GROUP, DIM).permute(1, 2, 0, 3).contiguous()
    with pytest.raises(RuntimeError, match="does not cover"):
        ext.prefill_attention(q4, cache, table[:1], 0, 0.125, 0, False, 64, 128)
    with pytest.raises(RuntimeError, match="key_block"):
        ext.prefill_attention(q4, cache, table, 0, 0.125, 0, False, 64, 100)
    with pytest.raises(RuntimeError, match="VNNI"):
        ext.prefill_attention(q4, cache, table, 0, 0.125, 0, True, 64, 128)
