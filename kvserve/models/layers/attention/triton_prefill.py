"""Triton paged prefill attention: many causal queries per sequence over a cached prefix.

Flash-attention over the paged cache (this step's keys are already written into it), so a
fresh prompt, a chunk of a long prompt and a prompt behind a prefix-cache hit are one case:
queries at positions [context_len, seq_len) attend to keys [0, their own position]. Grid
(query tiles, prefill sequences, query heads); tiles past a sequence's end do nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvserve.models.layers.attention.triton_decode import dot_precision
from kvserve.models.layers.triton_launch import INTERPRETING


@triton.jit
def _attend_tiles(
    acc,
    l_i,
    m_i,
    q,
    q_pos,
    table,
    cache_ptr,
    d,
    d_mask,
    lo,
    hi,
    kv_head,
    qk_scale,
    window,
    v_offset,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Online softmax over key tiles [lo, hi); scores in log2 units (exp2). Unmasked tiles
    (wholly before the tile's first query, no window) skip the causal mask."""
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < hi
        page = tl.load(table + offs_n // PAGE, mask=n_mask, other=0).to(tl.int64)
        slot = page * PAGE + offs_n % PAGE
        kv = slot[:, None] * (NUM_KV_HEADS * HEAD_DIM) + kv_head * HEAD_DIM + d[None, :]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(cache_ptr + kv, mask=kv_mask, other=0.0)
        v = tl.load(cache_ptr + v_offset + kv, mask=kv_mask, other=0.0)
        if UPCAST:  # the interpreter's bf16 dot is wrong; run it in fp32 there
            k, v = k.to(tl.float32), v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
        if MASKED:
            visible = (offs_n[None, :] <= q_pos[:, None]) & n_mask[None, :]
            visible &= (window <= 0) | (offs_n[None, :] > q_pos[:, None] - window)
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row with no visible key yet (window edge) keeps m = -inf; shift by 0 to avoid NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


# NOTE: not specialized on the block-table width (triton_decode.py's kernel says why): a prompt of
# one block (width 1) compiled its own variant inside a request (measured on an H200: 1.06 s).
@triton.jit(do_not_specialize=["window", "stride_bt"])
def _prefill_kernel(
    q_ptr,  # [num_tokens, num_heads, head_dim]
    cache_ptr,  # [2, num_blocks, page, num_kv_heads, head_dim]; V starts at v_offset
    out_ptr,  # [num_tokens, num_heads, head_dim]
    block_tables_ptr,  # [num_prefills, max_blocks]
    query_start_ptr,  # [num_prefills + 1] offsets into q / out
    context_lens_ptr,  # [num_prefills]
    qk_scale,  # softmax scale * log2(e)
    window,  # 0: no sliding window
    v_offset,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_bt,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    tile = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    kv_head = head // GROUP
    q_start = tl.load(query_start_ptr + seq).to(tl.int32)
    num_queries = tl.load(query_start_ptr + seq + 1).to(tl.int32) - q_start
    context_len = tl.load(context_lens_ptr + seq).to(tl.int32)

    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < num_queries
    q_pos = context_len + offs_m  # absolute positions of this tile's queries
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(
        q_ptr + rows[:, None] * stride_qt + head * stride_qh + d[None, :],
        mask=m_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)
    else:
        q = q.to(cache_ptr.dtype.element_ty)

    # Keys [lo, hi): up to the tile's last query; from the window start of its first query.
    # Without a window, keys before `full_hi` precede every query of the tile: no mask there.
    is_live = tile * BLOCK_M < num_queries
    first_pos = context_len + tile * BLOCK_M
    hi = tl.where(is_live, tl.minimum(context_len + num_queries, first_pos + BLOCK_M), 0)
    lo = tl.where(window > 0, tl.maximum(first_pos - window + 1, 0), 0)
    lo = tl.where(is_live, (lo // BLOCK_N) * BLOCK_N, 0)
    full_hi = tl.where(window > 0, lo, tl.minimum((first_pos // BLOCK_N) * BLOCK_N, hi))

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    acc, l_i, m_i = _attend_tiles(
        acc, l_i, m_i, q, q_pos, table, cache_ptr, d, d_mask, lo, full_hi, kv_head, qk_scale, window,
        v_offset, NUM_KV_HEADS, HEAD_DIM, PAGE, BLOCK_N, False, UPCAST, PRECISION,
    )  # fmt: skip
    acc, l_i, m_i = _attend_tiles(
        acc, l_i, m_i, q, q_pos, table, cache_ptr, d, d_mask, full_hi, hi, kv_head, qk_scale, window,
        v_offset, NUM_KV_HEADS, HEAD_DIM, PAGE, BLOCK_N, True, UPCAST, PRECISION,
    )  # fmt: skip

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_ptrs = out_ptr + rows[:, None] * stride_ot + head * stride_oh + d[None, :]
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def _configs(shapes: list[tuple[int, int, int, int]]) -> list[triton.Config]:
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=st) for m, n, w, st in shapes]


# On CUDA the tile shape is tuned once per head size/group (at the start-up profiling forward);
# the interpreter gets one fixed config. Heads over 128 (Gemma 3: 256) get small tiles only: a
# 128-row fp32 accumulator of 256 columns spills, and ptxas takes minutes over such configs.
_SMALL_HEAD_SHAPES = [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 32, 4, 4)]
_LARGE_HEAD_SHAPES = [(64, 32, 8, 2), (32, 32, 4, 2)]
_KEY = ["HEAD_DIM", "GROUP", "PAGE"]
_tuned_small_head = triton.autotune(_configs(_SMALL_HEAD_SHAPES), key=_KEY)(_prefill_kernel)
_tuned_large_head = triton.autotune(_configs(_LARGE_HEAD_SHAPES), key=_KEY)(_prefill_kernel)
_LOG2E = 1.4426950408889634


def prefill_attention(
    q: torch.Tensor,
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start: torch.Tensor,
    context_lens: torch.Tensor,
    out: torch.Tensor,
    *,
    max_num_queries: int,
    scale: float,
    window: int | None,
) -> None:
    """q, out: [num_tokens, num_heads, head_dim] (the whole flat batch; `query_start` indexes it);
    block_tables/context_lens: one row per prefill sequence; query_start: [num_prefills + 1]."""
    num_heads, head_dim = q.shape[1:]
    _, num_blocks, page, num_kv_heads, _ = cache.shape
    num_prefills = context_lens.shape[0]

    def grid(meta: dict) -> tuple[int, int, int]:
        return (triton.cdiv(max_num_queries, meta["BLOCK_M"]), num_prefills, num_heads)

    kernel = _tuned_small_head if head_dim <= 128 else _tuned_large_head
    if INTERPRETING:
        kernel = _prefill_kernel
    fixed = {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4} if INTERPRETING else {}
    kernel[grid](
        q,
        cache,
        out,
        block_tables,
        query_start,
        context_lens,
        scale * _LOG2E,
        window or 0,
        num_blocks * page * num_kv_heads * head_dim,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        NUM_KV_HEADS=num_kv_heads,
        GROUP=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        PAGE=page,
        UPCAST=INTERPRETING,
        PRECISION=dot_precision(cache.dtype),
        **fixed,
    )
