"""TorchRefBackend against a dense per-sequence attention written from the definition."""

from __future__ import annotations

import random

import pytest
import torch

from kvserve.models.layers.attention.backend import AttentionBackend
from kvserve.models.layers.attention.cpu_prefill import CpuPrefillKernel
from kvserve.models.layers.attention.metadata import AttentionMetadata
from kvserve.models.layers.attention.torch_ref import TorchRefBackend

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 6, 2, 16, 4, 256


def _dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context_len: int, window: int | None):
    """q: [n, H, D] at positions context_len.., k/v: [L, KVH, D] for positions 0..L-1."""
    group = NUM_HEADS // NUM_KV_HEADS
    k, v = k.repeat_interleave(group, 1).float(), v.repeat_interleave(group, 1).float()
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * HEAD_DIM**-0.5
    i = torch.arange(context_len, context_len + q.shape[0])[:, None]
    j = torch.arange(k.shape[0])[None, :]
    visible = (j <= i) & ((i - j < window) if window is not None else True)
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def _run(
    batch: list[tuple[int, int]],
    window: int | None,
    dtype: torch.dtype,
    device: str = "cpu",
    backend: AttentionBackend | None = None,
    computes_prompt: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """batch: (context_len, num_new) per sequence; the leading one-token entries form the decode group.
    Earlier steps' KV is written by the reference backend; `backend` writes this step's and attends."""
    gen = torch.Generator().manual_seed(0)
    # Random, not zero: a read of a slot that should be masked or was never written must show.
    cache = torch.randn(2, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    free = list(range(NUM_BLOCKS))
    random.Random(0).shuffle(free)
    ref = TorchRefBackend()
    backend = backend or ref
    tables, slots, qs, ks, vs, expected, starts = [], [], [], [], [], [], [0]
    for context_len, num_new in batch:
        seq_len = context_len + num_new
        blocks = [free.pop() for _ in range(-(-seq_len // BLOCK_SIZE))]
        seq_slots = torch.tensor(
            [blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(seq_len)]
        )
        k = torch.randn(seq_len, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
        v = torch.randn(seq_len, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
        q = torch.randn(num_new, NUM_HEADS, HEAD_DIM, generator=gen).to(dtype)
        # Earlier steps' KV, written on CPU.
        ref.write_kv(cache, k[:context_len], v[:context_len], seq_slots[:context_len])
        tables.append(blocks)
        slots.append(seq_slots[context_len:])
        qs.append(q), ks.append(k[context_len:]), vs.append(v[context_len:])
        expected.append(_dense_attention(q, k, v, context_len, window))
        starts.append(starts[-1] + num_new)
    width = max(map(len, tables))
    seq_lens = [c + n for c, n in batch]
    metadata = AttentionMetadata(
        block_size=BLOCK_SIZE,
        num_decodes=next((i for i, (c, n) in enumerate(batch) if n != 1 or c == 0), len(batch)),
        slot_mapping=torch.cat(slots),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
        seq_lens=torch.tensor(seq_lens),
        query_start_loc_cpu=starts,
        seq_lens_cpu=seq_lens,
        context_lens_cpu=[c for c, _ in batch],
        computes_prompt=computes_prompt,
    )
    if device != "cpu":
        cache = cache.to(device)
        for name in ("slot_mapping", "block_tables", "seq_lens"):
            setattr(metadata, name, getattr(metadata, name).to(device))
    k_new, v_new = torch.cat(ks).to(device), torch.cat(vs).to(device)
    backend.write_kv(cache, k_new, v_new, metadata.slot_mapping)
    out = backend.attend(
        torch.cat(qs).to(device), k_new, v_new, cache, metadata, scale=HEAD_DIM**-0.5, sliding_window=window
    )
    return out.float().cpu(), torch.cat(expected)


BATCHES = {
    "single_decode": [(29, 1)],
    "ragged_decodes": [(29, 1), (6, 1), (17, 1)],
    "fresh_prefill": [(0, 23)],
    "chunk_with_context": [(13, 10)],
    "mixed": [(29, 1), (8, 1), (0, 9), (14, 7), (3, 1)],  # the last is a one-token prefill chunk
}


@pytest.mark.parametrize("window", [None, 5, 8])
@pytest.mark.parametrize("batch", BATCHES.values(), ids=BATCHES.keys())
def test_matches_dense_fp32(batch: list[tuple[int, int]], window: int | None) -> None:
    out, expected = _run(batch, window, torch.float32)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 5])
def test_matches_dense_bf16(window: int | None) -> None:
    out, expected = _run(BATCHES["mixed"], window, torch.bfloat16)
    # The oracle runs in fp32 on the same bf16 inputs; bf16 output rounding is ~4e-3 relative.
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 5])
def test_matches_dense_cuda(window: int | None, dtype: torch.dtype) -> None:
    out, expected = _run(BATCHES["mixed"], window, dtype, device="cuda")
    tol = 1e-3 if dtype == torch.float32 else 2e-2  # fp32 matmuls may use TF32 on CUDA
    torch.testing.assert_close(out, expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("batch", BATCHES.values(), ids=BATCHES.keys())
def test_bf16_prefill_attention_matches_dense(batch: list[tuple[int, int]], window: int | None) -> None:
    """--bf16-prefill's attention: fp32 engine, prompt rows attended in bf16 (all rows, one-token
    prompt tails included, since a prompt forward holds only prompt rows)."""
    backend = TorchRefBackend(prefill_dtype=torch.bfloat16)
    out, expected = _run(batch, window, torch.float32, backend=backend, computes_prompt=True)
    torch.testing.assert_close(out, expected, atol=3e-2, rtol=3e-2)
    assert not torch.equal(out, _run(batch, window, torch.float32)[0])  # it did run in bf16


@pytest.mark.parametrize("prefill_dtype", [None, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16], ids=["kv32", "kv16"])
def test_prompt_rows_do_not_depend_on_chunking(
    prefill_dtype: torch.dtype | None, cache_dtype: torch.dtype
) -> None:
    """One 40-token prompt in one forward, in 17 + 23, and in 39 + 1 (a one-token tail, which a
    prompt forward attends as a prefill under prefill_dtype): every row reads the same keys as
    stored. The C++ prompt attention (fp32; bf16 on AMX or AVX512-BF16) gives the same bits (but for the fp32
    one-token tail, which an fp32 forward attends as a decode row); torch's CPU flash
    kernel, where it runs instead, is not bit-exact across key counts (a few rows differ in their
    last bit: 1.8e-7 in fp32, one bf16 ulp); the engine tests check that the tokens do not change
    (tests/e2e/test_engine_real.py)."""
    gen = torch.Generator().manual_seed(3)
    n = 40
    q = torch.randn(n, NUM_HEADS, HEAD_DIM, generator=gen)
    k = torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    whole = _prompt_chunks(q, k, v, [n], cache_dtype, prefill_dtype)
    ulp = 2**-7 if prefill_dtype == torch.bfloat16 else 2**-22
    kernel = CpuPrefillKernel.for_dtype(prefill_dtype or torch.float32) is not None
    for cuts in ([17, 23], [39, 1]):
        chunked = _prompt_chunks(q, k, v, cuts, cache_dtype, prefill_dtype)
        if kernel and (prefill_dtype is not None or cuts[-1] > 1):
            assert torch.equal(chunked, whole)
        else:
            torch.testing.assert_close(chunked, whole, atol=ulp * 4, rtol=ulp)


def test_grouped_heads_are_folded_into_queries_with_the_bits_of_repeated_kv(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Folding a KV head's query heads into its query rows (no repeat_interleave of K and V) gives
    exactly what SDPA over repeated K/V gives, on the SDPA path (CPUs without the C++ kernels)."""
    monkeypatch.setattr(TorchRefBackend, "_prefill_kernel", lambda self, dtype, cache: None)
    gen = torch.Generator().manual_seed(5)
    n = 40
    q = torch.randn(n, NUM_HEADS, HEAD_DIM, generator=gen)
    k = torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    group = NUM_HEADS // NUM_KV_HEADS
    k_rep, v_rep = (t.repeat_interleave(group, dim=1).transpose(0, 1)[None] for t in (k, v))
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k_rep, v_rep, is_causal=True, scale=HEAD_DIM**-0.5
    )[0].transpose(0, 1)
    assert torch.equal(_prompt_chunks(q, k, v, [n], torch.float32, None), expected)


def _prompt_chunks(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    chunks: list[int],
    cache_dtype: torch.dtype,
    prefill_dtype: torch.dtype | None,
) -> torch.Tensor:
    """The attention output of every row of one prompt, computed in forwards of `chunks` tokens."""
    backend = TorchRefBackend(prefill_dtype=prefill_dtype)
    cache = torch.zeros(2, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype=cache_dtype)
    table = torch.arange(-(-q.shape[0] // BLOCK_SIZE))[None, :] + 5
    outputs, start = [], 0
    for size in chunks:
        end = start + size
        slots = torch.tensor(
            [int(table[0, p // BLOCK_SIZE]) * BLOCK_SIZE + p % BLOCK_SIZE for p in range(start, end)]
        )
        metadata = AttentionMetadata(
            block_size=BLOCK_SIZE,
            num_decodes=1 if size == 1 else 0,
            slot_mapping=slots,
            block_tables=table,
            seq_lens=torch.tensor([end]),
            query_start_loc_cpu=[0, size],
            seq_lens_cpu=[end],
            context_lens_cpu=[start],
            computes_prompt=True,
        )
        backend.write_kv(cache, k[start:end], v[start:end], slots)
        outputs.append(
            backend.attend(q[start:end], k[start:end], v[start:end], cache, metadata, scale=HEAD_DIM**-0.5)
        )
        start = end
    return torch.cat(outputs)
