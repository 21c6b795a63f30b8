"""Triton kernels for the small ops of a decoder layer on CUDA: RMSNorm (with the residual add
fused in), rotary embedding and its cos/sin tables, and SiLU-and-multiply.

Why: a CUDA-graph decode step of a 1B model is bounded by kernel count, not bytes; in plain torch
each of these ops is 3-5 kernels (casts, cat, mul, add), per layer. Each kernel here is one
launch and rounds exactly where the torch code does (HF's order), so results match the torch
path bit for bit in bf16 up to the fp32 reduction order of the norm.
`KVSERVE_FUSED_OPS=0` turns them off (for A/B measurements).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvserve.env import switches
from kvserve.models.layers.triton_launch import pdl_enter, use_pdl

ENABLED = switches().is_fused_ops_enabled  # read at every call: tests and A/B scripts flip it


def use_fused(x: torch.Tensor) -> bool:
    return ENABLED and x.is_cuda


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    sum_ptr,
    stride_x,
    stride_r,
    eps,
    N: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    IS_FP32: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)  # see triton_launch.py
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # rounded like torch's add
        tl.store(sum_ptr + row * N + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / N + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if IS_FP32:
        out = xf * rstd * w
    else:  # HF: normalize in fp32, cast, then scale in the input dtype
        out = (xf * rstd).to(x.dtype).to(tl.float32) * w
    tl.store(out_ptr + row * N + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x: [T, N] (row stride free, unit column stride) -> (norm(x + residual), x + residual or None)."""
    num_rows, n = x.shape
    assert x.stride(-1) == 1 and (residual is None or residual.stride(-1) == 1)
    out = torch.empty(num_rows, n, dtype=x.dtype, device=x.device)
    total = torch.empty_like(out) if residual is not None else out
    block = triton.next_power_of_2(n)
    pdl = use_pdl(x)
    _rms_norm_kernel[(num_rows,)](
        x,
        residual if residual is not None else x,
        weight,
        out,
        total,
        x.stride(0),
        residual.stride(0) if residual is not None else 0,
        eps,
        N=n,
        BLOCK=block,
        HAS_RESIDUAL=residual is not None,
        IS_FP32=x.dtype == torch.float32,
        PDL=pdl,
        num_warps=min(16, max(1, block // 256)),
        launch_pdl=pdl,
    )
    return out, (total if residual is not None else None)


@triton.jit
def _rotary_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    v_ptr,
    cache_ptr,
    slot_ptr,
    v_offset,
    stride_xt,
    stride_xh,
    stride_vt,
    stride_vh,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    WRITE_KV: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)  # see triton_launch.py
    token = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)
    d = tl.arange(0, HEAD_DIM)
    half = HEAD_DIM // 2
    rot_d = tl.where(d < half, d + half, d - half)
    mask = heads[:, None] < NUM_HEADS
    base = x_ptr + token * stride_xt + heads[:, None] * stride_xh
    x = tl.load(base + d[None, :], mask=mask, other=0.0)
    rotated = tl.load(base + rot_d[None, :], mask=mask, other=0.0)
    cos = tl.load(cos_ptr + token * HEAD_DIM + d)[None, :].to(tl.float32)
    sin = tl.load(sin_ptr + token * HEAD_DIM + d)[None, :].to(tl.float32)
    # Same roundings as `x * cos + rotated * sin` in the input dtype.
    a = (x.to(tl.float32) * cos).to(x.dtype).to(tl.float32)
    b = (rotated.to(tl.float32) * sin).to(x.dtype).to(tl.float32)
    out = (a + b).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + (token * NUM_HEADS + heads[:, None]) * HEAD_DIM + d[None, :], out, mask=mask)
    if WRITE_KV:  # the last NUM_KV_HEADS heads are the keys: into the paged cache, with the values
        slot = tl.load(slot_ptr + token).to(tl.int64)
        row = slot * (NUM_KV_HEADS * HEAD_DIM)
        first_k = NUM_HEADS - NUM_KV_HEADS
        is_written = (heads[:, None] * 0 + slot) >= 0  # a block, not a scalar; padded rows carry slot -1
        is_key = mask & (heads[:, None] >= first_k) & is_written
        k_dst = cache_ptr + row + (heads[:, None] - first_k) * HEAD_DIM + d[None, :]
        tl.store(k_dst, out.to(cache_ptr.dtype.element_ty), mask=is_key)
        kv_heads = tl.arange(0, BLOCK_KV)[:, None]
        v_mask = (kv_heads < NUM_KV_HEADS) & ((kv_heads * 0 + slot) >= 0)
        v = tl.load(v_ptr + token * stride_vt + kv_heads * stride_vh + d[None, :], mask=v_mask)
        v_dst = cache_ptr + v_offset + row + kv_heads * HEAD_DIM + d[None, :]
        tl.store(v_dst, v.to(cache_ptr.dtype.element_ty), mask=v_mask)


def rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    kv_cache: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    slot_mapping: torch.Tensor | None = None,
) -> torch.Tensor:
    """x: [T, H, D] (a strided view; unit stride on D) -> rotated contiguous copy. cos/sin:
    [T, 1, D] contiguous (sin's first half already negated, see rotary.py).

    With `kv_cache` ([2, num_blocks, block_size, KV, D]), `v` ([T, KV, D]) and `slot_mapping`,
    the last KV heads of x are keys: the kernel also writes them, rotated, and `v` into the cache
    slots, as TritonBackend.write_kv would (one launch instead of two per layer)."""
    num_tokens, num_heads, head_dim = x.shape
    assert x.stride(-1) == 1 and cos.is_contiguous() and sin.is_contiguous()
    assert head_dim == triton.next_power_of_2(head_dim)
    out = torch.empty(num_tokens, num_heads, head_dim, dtype=x.dtype, device=x.device)
    write_kv = kv_cache is not None
    if write_kv:
        assert v is not None and slot_mapping is not None and v.stride(-1) == 1
        num_kv_heads = kv_cache.shape[-2]
        v_offset = kv_cache[1].storage_offset() - kv_cache.storage_offset()
    else:
        v, kv_cache, slot_mapping, num_kv_heads, v_offset = x, x, x, 1, 0
    pdl = use_pdl(x)
    _rotary_kernel[(num_tokens,)](
        x,
        cos,
        sin,
        out,
        v,
        kv_cache,
        slot_mapping,
        v_offset,
        x.stride(0),
        x.stride(1),
        v.stride(0),
        v.stride(1),
        NUM_HEADS=num_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_heads),
        NUM_KV_HEADS=num_kv_heads,
        BLOCK_KV=triton.next_power_of_2(num_kv_heads),
        WRITE_KV=write_kv,
        PDL=pdl,
        num_warps=4,
        launch_pdl=pdl,
    )
    return out


@triton.jit
def _rope_tables_kernel(
    pos_ptr,
    inv_freq_ptr,
    cos_ptr,
    sin_ptr,
    attention_factor,
    HALF: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)  # see triton_launch.py
    token = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK)
    mask = i < HALF
    freqs = tl.load(pos_ptr + token).to(tl.float32) * tl.load(inv_freq_ptr + i, mask=mask, other=0.0)
    # libdevice's cosf/sinf: the functions torch's CUDA cos/sin call, not the fast approximations.
    # The attention factor (YaRN's mscale) scales both in fp32 before the cast, as transformers does;
    # x * 1.0 is exact, so unscaled RoPE keeps its bits.
    cos = (tl.extra.cuda.libdevice.cos(freqs) * attention_factor).to(cos_ptr.dtype.element_ty)
    sin = (tl.extra.cuda.libdevice.sin(freqs) * attention_factor).to(sin_ptr.dtype.element_ty)
    row = token * 2 * HALF
    tl.store(cos_ptr + row + i, cos, mask=mask)
    tl.store(cos_ptr + row + HALF + i, cos, mask=mask)
    tl.store(sin_ptr + row + i, -sin, mask=mask)
    tl.store(sin_ptr + row + HALF + i, sin, mask=mask)


def rope_tables(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype, attention_factor: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """RotaryEmbedding.forward in one launch instead of ~9 (a CUDA-graph decode step pays ~2 us for
    each): positions [T] -> cos, sin [T, 1, head_dim] in `dtype`, sin's first half negated, both
    multiplied by `attention_factor`."""
    (num_tokens,) = positions.shape
    half = inv_freq.shape[0]
    cos = torch.empty(num_tokens, 1, 2 * half, dtype=dtype, device=positions.device)
    sin = torch.empty_like(cos)
    if num_tokens:
        pdl = use_pdl(positions)
        _rope_tables_kernel[(num_tokens,)](
            positions,
            inv_freq,
            cos,
            sin,
            float(attention_factor),
            HALF=half,
            BLOCK=triton.next_power_of_2(half),
            PDL=pdl,
            num_warps=1,
            launch_pdl=pdl,
        )
    return cos, sin


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, stride_x, D: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + D + cols, mask=mask, other=0.0)
    act = (gate / (1.0 + tl.exp(-gate))).to(up.dtype)  # silu, rounded like F.silu's output
    out = act.to(tl.float32) * up.to(tl.float32)
    tl.store(out_ptr + row * D + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """[T, 2 * D] (gate then up) -> silu(gate) * up, [T, D]."""
    num_rows, width = x.shape
    d = width // 2
    assert x.stride(-1) == 1
    out = torch.empty(num_rows, d, dtype=x.dtype, device=x.device)
    block = 1024
    _silu_mul_kernel[(num_rows, triton.cdiv(d, block))](x, out, x.stride(0), D=d, BLOCK=block, num_warps=4)
    return out
