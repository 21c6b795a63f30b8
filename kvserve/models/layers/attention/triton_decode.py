"""Triton paged decode attention: one query token per sequence, split-K over long contexts.

Grid (num_seqs, num_kv_heads, num_splits). One program reads its KV head's keys once for
every query head of the GQA group (the group is the M dimension of the dot, padded to 16),
over one contiguous slice of the sequence; a second kernel merges the slices by their
log-sum-exp. The grid depends only on the batch size and `num_splits`, never on the
sequence lengths (each program derives its slice from `seq_lens` on the device), so the
same launch is valid inside a CUDA graph replayed at any context length.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvserve.models.layers.triton_launch import INTERPRETING, pdl_enter, use_pdl

BLOCK_N = 64  # keys per tile


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 caches get exact fp32 dots (parity runs); Triton's default there is TF32."""
    return "ieee" if dtype == torch.float32 else "tf32"


# NOTE: Triton compiles one variant per specialization of its integer arguments (== 1, divisible by
# 16); an eager step's block-table width is its longest sequence's block count, so without this
# each new width class compiled the kernel again inside a request (measured on an H200: 290-560 ms each,
# seen by engine/compile_watch.py after the warm-up). The stride is an address offset: nothing to gain.
@triton.jit(do_not_specialize=["window", "stride_bt"])
def _decode_split_kernel(
    q_ptr,  # [num_seqs, num_heads, head_dim]
    cache_ptr,  # [2, num_blocks, page, num_kv_heads, head_dim]; V starts at v_offset
    block_tables_ptr,  # [num_seqs, max_blocks]
    seq_lens_ptr,  # [num_seqs]
    out_ptr,  # [num_seqs, num_heads, head_dim] (used when NUM_SPLITS == 1)
    mid_o_ptr,  # [num_seqs, num_heads, NUM_SPLITS, head_dim] float32
    mid_lse_ptr,  # [num_seqs, num_heads, NUM_SPLITS] float32
    scale,
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
    BLOCK_H: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)  # see triton_launch.py
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    lo = tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)
    per_split = tl.cdiv(tl.cdiv(seq_len - lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = lo + split * per_split
    end = tl.minimum(start + per_split, seq_len)

    heads = tl.arange(0, BLOCK_H)
    head_mask = heads < GROUP
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    q_heads = kv_head * GROUP + heads
    q = tl.load(
        q_ptr + seq * stride_qt + q_heads[:, None] * stride_qh + d[None, :],
        mask=head_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)
    else:
        q = q.to(cache_ptr.dtype.element_ty)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for n0 in range(start, end, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs < end
        page = tl.load(table + offs // PAGE, mask=n_mask, other=0).to(tl.int64)
        slot = page * PAGE + offs % PAGE
        kv = slot[:, None] * (NUM_KV_HEADS * HEAD_DIM) + kv_head * HEAD_DIM + d[None, :]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(cache_ptr + kv, mask=kv_mask, other=0.0)
        v = tl.load(cache_ptr + v_offset + kv, mask=kv_mask, other=0.0)
        if UPCAST:  # the interpreter's bf16 dot is wrong; run it in fp32 there
            k, v = k.to(tl.float32), v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [BLOCK_H, BLOCK_N]
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    has_keys = l_i > 0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    out_mask = head_mask[:, None] & d_mask[None, :]
    if NUM_SPLITS == 1:
        o_ptrs = out_ptr + seq * stride_ot + q_heads[:, None] * stride_oh + d[None, :]
        tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        row = (seq * (NUM_KV_HEADS * GROUP) + q_heads) * NUM_SPLITS + split  # [BLOCK_H]
        tl.store(mid_o_ptr + row[:, None] * HEAD_DIM + d[None, :], out, mask=out_mask)
        lse = tl.where(has_keys, m_i + tl.log(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        tl.store(mid_lse_ptr + row, lse, mask=head_mask)


@triton.jit
def _decode_reduce_kernel(
    mid_o_ptr,
    mid_lse_ptr,
    out_ptr,
    stride_ot,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)  # see triton_launch.py
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row = seq * NUM_HEADS + head
    splits = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    lse = tl.load(mid_lse_ptr + row * NUM_SPLITS + splits)  # [NUM_SPLITS]
    lse_max = tl.max(lse, 0)
    weight = tl.where(lse > float("-inf"), tl.exp(lse - lse_max), 0.0)
    o = tl.load(
        mid_o_ptr + (row * NUM_SPLITS + splits)[:, None] * HEAD_DIM + d[None, :],
        mask=d_mask[None, :],
        other=0.0,
    )
    out = tl.sum(o * weight[:, None], 0) / tl.sum(weight, 0)
    tl.store(out_ptr + seq * stride_ot + head * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d_mask)


# Every value choose_num_splits can return: NUM_SPLITS is a compile-time constant, so each is a
# kernel variant of its own (compile_split_variants).
SPLIT_CHOICES = (1, 2, 4, 8, 16)


def compile_split_variants(cache: torch.Tensor, num_heads: int, *, scale: float, window: int | None) -> None:
    """Run the decode kernels once per split count, over one one-token sequence in block 0 (the
    cache is only read), so that no eager step compiles one inside a request: the warm-up's batches
    reach only the split counts of their own sizes (engine/warmup.py)."""
    _, _, _, num_kv_heads, head_dim = cache.shape
    # q as the model hands it over: the query heads of a fused qkv row (its strides, hence its variant).
    qkv = torch.zeros(1, num_heads + 2 * num_kv_heads, head_dim, dtype=cache.dtype, device=cache.device)
    q = qkv[:, :num_heads]
    tables = torch.zeros(1, 1, dtype=torch.int64, device=cache.device)
    seq_lens = torch.ones(1, dtype=torch.int64, device=cache.device)
    for num_splits in SPLIT_CHOICES:
        decode_attention(
            q, cache, tables, seq_lens, torch.empty_like(q), scale=scale, window=window, num_splits=num_splits
        )


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int | None, num_sms: int) -> int:
    """Enough programs to fill the chip twice, a power of two, at most 16; without `max_seq_len`
    (a CUDA graph, replayed at any length) the choice depends on the batch alone."""
    wanted = -(-2 * num_sms // max(1, num_seqs * num_kv_heads))
    if max_seq_len is not None:
        wanted = min(wanted, -(-max_seq_len // BLOCK_N))
    return min(16, triton.next_power_of_2(max(1, wanted)))


def decode_attention(
    q: torch.Tensor,
    cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    *,
    scale: float,
    window: int | None,
    num_splits: int,
) -> None:
    """q, out: [num_seqs, num_heads, head_dim]; writes `out` (may be a view into a larger buffer)."""
    num_seqs, num_heads, head_dim = q.shape
    _, num_blocks, page, num_kv_heads, _ = cache.shape
    group = num_heads // num_kv_heads
    block_d = triton.next_power_of_2(head_dim)
    pdl = use_pdl(q)
    mid_o = mid_lse = out  # unused placeholders when there is one split
    if num_splits > 1:
        mid_o = torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        mid_lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=q.device)
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q,
        cache,
        block_tables,
        seq_lens,
        out,
        mid_o,
        mid_lse,
        scale,
        window or 0,
        num_blocks * page * num_kv_heads * head_dim,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        NUM_KV_HEADS=num_kv_heads,
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        PAGE=page,
        BLOCK_N=BLOCK_N,
        NUM_SPLITS=num_splits,
        UPCAST=INTERPRETING,
        PRECISION=dot_precision(cache.dtype),
        PDL=pdl,
        num_warps=4,
        num_stages=2,
        launch_pdl=pdl,
    )
    if num_splits > 1:
        _decode_reduce_kernel[(num_seqs, num_heads)](
            mid_o,
            mid_lse,
            out,
            out.stride(0),
            out.stride(1),
            NUM_HEADS=num_heads,
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            NUM_SPLITS=num_splits,
            PDL=pdl,
            num_warps=4,
            launch_pdl=pdl,
        )
