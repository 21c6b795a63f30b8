"""The fused CPU decode attention (RoPE + KV write + paged attention in one C++ call) against the
torch path it replaces: apply_rotary, TorchRefBackend.write_kv and TorchRefBackend.attend."""

from __future__ import annotations

import random

import pytest
import torch

from kvserve.models.layers import cpu_ext
from kvserve.models.layers.attention import cpu_decode
from kvserve.models.layers.attention.metadata import AttentionMetadata
from kvserve.models.layers.attention.torch_ref import TorchRefBackend
from kvserve.models.layers.norm import RMSNorm
from kvserve.models.layers.rotary import RotaryEmbedding, apply_rotary

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 6, 2, 64, 4, 128

pytestmark = pytest.mark.skipif(cpu_ext.load() is None, reason="no AVX2 CPU kernels here")


def _decode_batch(
    seq_lens: list[int],
    num_kv_heads: int = NUM_KV_HEADS,
    head_dim: int = HEAD_DIM,
    num_blocks: int = NUM_BLOCKS,
) -> tuple[torch.Tensor, AttentionMetadata]:
    """A random cache (garbage in unwritten slots) and the metadata of one decode per sequence."""
    gen = torch.Generator().manual_seed(0)
    cache = torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, generator=gen)
    free = list(range(num_blocks))
    random.Random(0).shuffle(free)  # scattered blocks: the kernel must follow the block table
    tables = [[free.pop() for _ in range(-(-n // BLOCK_SIZE))] for n in seq_lens]
    width = max(map(len, tables))
    slots = [t[(n - 1) // BLOCK_SIZE] * BLOCK_SIZE + (n - 1) % BLOCK_SIZE for t, n in zip(tables, seq_lens)]
    metadata = AttentionMetadata(
        block_size=BLOCK_SIZE,
        num_decodes=len(seq_lens),
        slot_mapping=torch.tensor(slots),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
        seq_lens=torch.tensor(seq_lens),
        query_start_loc_cpu=list(range(len(seq_lens) + 1)),
        seq_lens_cpu=seq_lens,
        context_lens_cpu=[n - 1 for n in seq_lens],
    )
    return cache, metadata


# The pool's dtypes under fp32 compute: fp32, and fp16 (the CPU default, widened with F16C).
KV_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
# Tolerances of the cache comparison: the same rounding, up to one fp16 ulp where the two RoPEs'
# fp32 results differ in their last bit on either side of a rounding boundary.
CACHE_TOL = {torch.float32: 1e-6, torch.float16: 1e-3}


@pytest.mark.parametrize("kv_dtype", KV_DTYPES.values(), ids=KV_DTYPES.keys())
@pytest.mark.parametrize("window", [None, 5, 700])
@pytest.mark.parametrize(
    "seq_lens",
    [[1], [29], [29, 6, 17, 1], [101], [1300], [1300, 37, 700]],
    ids=["first", "one", "ragged", "tiles", "chunks", "chunks-ragged"],
)
def test_matches_the_torch_path(seq_lens: list[int], window: int | None, kv_dtype: torch.dtype) -> None:
    """Long sequences run as chunks of 512 keys whose partial results are merged."""
    cache, metadata = _decode_batch(seq_lens, num_blocks=640)
    cache = cache.to(kv_dtype)
    qkv = torch.randn(len(seq_lens), (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM)
    cos, sin = RotaryEmbedding(HEAD_DIM, 10_000.0)(torch.tensor(seq_lens) - 1, torch.float32)
    scale = HEAD_DIM**-0.5

    ref_cache = cache.clone()
    heads = qkv.view(len(seq_lens), -1, HEAD_DIM)
    qk = apply_rotary(heads[:, : NUM_HEADS + NUM_KV_HEADS], cos, sin)
    q, k, v = qk[:, :NUM_HEADS], qk[:, NUM_HEADS:], heads[:, NUM_HEADS + NUM_KV_HEADS :]
    backend = TorchRefBackend()
    backend.write_kv(ref_cache, k, v, metadata.slot_mapping)
    expected = backend.attend(q, k, v, ref_cache, metadata, scale=scale, sliding_window=window)

    out = cpu_decode.attend_qkv(qkv, cos, sin, cache, metadata, NUM_HEADS, NUM_KV_HEADS, scale, window)
    assert out is not None
    torch.testing.assert_close(out, expected.reshape(len(seq_lens), -1), atol=1e-5, rtol=1e-5)
    tol = CACHE_TOL[kv_dtype]
    torch.testing.assert_close(cache, ref_cache, atol=tol, rtol=tol)  # the same KV write


def test_fp16_cache_saturates_as_the_torch_write_does() -> None:
    """A value past fp16's range is stored as +-65504 by both writes, never as inf (which would
    turn every later score of that key into NaN)."""
    seq_lens = [3, 9]
    cache, metadata = _decode_batch(seq_lens)
    cache = cache.half()
    ref_cache = cache.clone()
    qkv = torch.randn(len(seq_lens), (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM)
    heads = qkv.view(len(seq_lens), -1, HEAD_DIM)
    heads[0, NUM_HEADS + NUM_KV_HEADS, :3] = torch.tensor([1e6, -1e6, 7e4])  # v: no RoPE in the way
    heads[1, NUM_HEADS + NUM_KV_HEADS, 5] = float("nan")  # a NaN stays one, as in torch's clamp
    cos, sin = RotaryEmbedding(HEAD_DIM, 10_000.0)(torch.tensor(seq_lens) - 1, torch.float32)
    qk = apply_rotary(heads[:, : NUM_HEADS + NUM_KV_HEADS], cos, sin)
    TorchRefBackend().write_kv(
        ref_cache, qk[:, NUM_HEADS:], heads[:, NUM_HEADS + NUM_KV_HEADS :], metadata.slot_mapping
    )
    out = cpu_decode.attend_qkv(qkv, cos, sin, cache, metadata, NUM_HEADS, NUM_KV_HEADS, 0.125, None)
    assert out is not None and bool(out[0].isfinite().all())
    slot = int(metadata.slot_mapping[0])
    stored = cache[1].view(-1, NUM_KV_HEADS, HEAD_DIM)[slot, 0, :3]
    assert stored.tolist() == [65504.0, -65504.0, 65504.0]
    assert torch.equal(ref_cache[1].view(-1, NUM_KV_HEADS, HEAD_DIM)[slot, 0, :3], stored)
    nan_slot = int(metadata.slot_mapping[1])
    for written in (cache, ref_cache):
        assert bool(written[1].view(-1, NUM_KV_HEADS, HEAD_DIM)[nan_slot, 0, 5].isnan())


# (heads, KV heads, head dim, RMSNorm offset): Qwen3's q/k norms (w), Gemma 3 270M's (1 + w, D = 256).
QK_NORM_SHAPES = {"qwen3": (6, 2, 64, 0.0), "gemma3_270m": (4, 1, 256, 1.0)}


@pytest.mark.parametrize("kv_dtype", KV_DTYPES.values(), ids=KV_DTYPES.keys())
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("seq_lens", [[1], [29], [29, 6, 17, 1]], ids=["first", "one", "ragged"])
@pytest.mark.parametrize("shape", QK_NORM_SHAPES.values(), ids=QK_NORM_SHAPES.keys())
def test_qk_norm_matches_the_torch_path(
    shape: tuple[int, int, int, float], seq_lens: list[int], window: int | None, kv_dtype: torch.dtype
) -> None:
    """Per-head RMSNorm of q and k before RoPE (Attention.attend_qkv's torch path), in the same call."""
    num_heads, num_kv_heads, head_dim, offset = shape
    cache, metadata = _decode_batch(seq_lens, num_kv_heads, head_dim)
    cache = cache.to(kv_dtype)
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(len(seq_lens), (num_heads + 2 * num_kv_heads) * head_dim, generator=gen) * 3
    cos, sin = RotaryEmbedding(head_dim, 10_000.0)(torch.tensor(seq_lens) - 1, torch.float32)
    q_norm, k_norm = RMSNorm(head_dim, 1e-6, offset), RMSNorm(head_dim, 1e-6, offset)
    with torch.no_grad():
        q_norm.weight.normal_(generator=gen), k_norm.weight.normal_(generator=gen)
    scale = 24**-0.5

    ref_cache = cache.clone()
    heads = qkv.view(len(seq_lens), -1, head_dim)
    with torch.no_grad():
        q = apply_rotary(q_norm(heads[:, :num_heads]), cos, sin)
        k = apply_rotary(k_norm(heads[:, num_heads : num_heads + num_kv_heads]), cos, sin)
    v = heads[:, num_heads + num_kv_heads :]
    backend = TorchRefBackend()
    backend.write_kv(ref_cache, k, v, metadata.slot_mapping)
    expected = backend.attend(q, k, v, ref_cache, metadata, scale=scale, sliding_window=window)

    with torch.no_grad():
        out = cpu_decode.attend_qkv(
            qkv, cos, sin, cache, metadata, num_heads, num_kv_heads, scale, window,
            q_norm.scale(), k_norm.scale(), 1e-6,
        )  # fmt: skip
    assert out is not None
    torch.testing.assert_close(out, expected.reshape(len(seq_lens), -1), atol=1e-5, rtol=1e-5)
    tol = max(CACHE_TOL[kv_dtype], 1e-5)
    torch.testing.assert_close(cache, ref_cache, atol=tol, rtol=tol)  # normed, rotated k; v as is


def test_declines_what_it_does_not_cover() -> None:
    cache, metadata = _decode_batch([9, 3])
    qkv = torch.randn(2, (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM)
    cos, sin = RotaryEmbedding(HEAD_DIM, 10_000.0)(torch.tensor([8, 2]), torch.float32)
    args = (NUM_HEADS, NUM_KV_HEADS, HEAD_DIM**-0.5, None)
    assert cpu_decode.attend_qkv(qkv.bfloat16(), cos, sin, cache.bfloat16(), metadata, *args) is None
    metadata.num_decodes = 1  # the second sequence is a (one-token) prefill chunk: mixed batch
    assert cpu_decode.attend_qkv(qkv, cos, sin, cache, metadata, *args) is None


@pytest.mark.parametrize("kv_dtype", KV_DTYPES.values(), ids=KV_DTYPES.keys())
@pytest.mark.parametrize("seq_lens", [[101], [1300], [1300, 37, 8]], ids=["one", "chunks", "three"])
def test_the_thread_count_does_not_change_the_bits(seq_lens: list[int], kv_dtype: torch.dtype) -> None:
    """A long sequence's chunks run on several threads; its arithmetic must not depend on how many
    (answers must not depend on --threads or on the batch)."""
    cache, metadata = _decode_batch(seq_lens, num_kv_heads=3, num_blocks=640)
    cache = cache.to(kv_dtype)
    heads, kv_heads = 9, 3
    qkv = torch.randn(len(seq_lens), (heads + 2 * kv_heads) * HEAD_DIM)
    cos, sin = RotaryEmbedding(HEAD_DIM, 10_000.0)(torch.tensor(seq_lens) - 1, torch.float32)
    threads = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2, 3, 4):
            torch.set_num_threads(n)
            out = cpu_decode.attend_qkv(qkv, cos, sin, cache.clone(), metadata, heads, kv_heads, 0.125, None)
            assert out is not None
            outs.append(out)
    finally:
        torch.set_num_threads(threads)
    for out in outs[1:]:
        assert torch.equal(out, outs[0])
