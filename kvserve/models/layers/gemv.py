"""Triton matrix-vector products for one-token (single-stream decode) steps on CUDA, with the
decoder layer's neighbouring small ops fused in: RMSNorm of the input (prologue), the residual
add or SiLU-and-multiply of a `[gate | up]` weight (epilogue), and a bias.

Why: at one token a linear layer is a weight read (bandwidth bound), and cuBLAS reaches only
~40% of copy speed on the 8-13 MB q/k/v/o matrices of a 1B model while each norm, add and
activation beside it is one more ~1-2 us launch. Here a layer is four GEMV launches. Every
program re-derives the norm's statistic from the whole input vector (a few KB, read from L2),
which is cheaper than a separate kernel. Roundings follow the unfused torch path (HF's order:
each op's output rounded to the activation dtype), so only the fp32 summation order differs.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kvserve.env import switches
from kvserve.models.layers.triton_launch import INTERPRETING, pdl_enter, use_pdl

# The greedy head's partial maxima go to this many int64 slots (see logits_argmax).
ARGMAX_SLOTS: tl.constexpr = tl.constexpr(128)
_INT64_MIN: tl.constexpr = tl.constexpr(-(2**63))


@triton.jit
def _x_tile(x_ptr, norm_ptr, k0, cols, rstd, K: tl.constexpr, HAS_NORM: tl.constexpr):
    """The input's [BLOCK_K] slice at k0 in fp32, normalized when HAS_NORM."""
    k_mask = k0 + cols < K
    x = tl.load(x_ptr + k0 + cols, mask=k_mask, other=0.0)
    if HAS_NORM:  # HF: normalize in fp32, cast, then scale in the activation dtype
        scale = tl.load(norm_ptr + k0 + cols, mask=k_mask, other=0.0).to(tl.float32)
        x = ((x.to(tl.float32) * rstd).to(x.dtype).to(tl.float32) * scale).to(x.dtype)
    return x.to(tl.float32)[None, :]


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    norm_ptr,
    residual_ptr,
    bias_ptr,
    argmax_ptr,
    eps,
    N,
    stride_w,
    K: tl.constexpr,
    HAS_NORM: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    ARGMAX: tl.constexpr,
    PDL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    cols = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rows[:, None].to(tl.int64) * stride_w
    # The first weight tile is loaded before waiting for the previous kernel (see triton_launch.py):
    # weights are never written, and its DRAM time then overlaps the kernels before this one.
    first_mask = row_mask[:, None] & (cols[None, :] < K)
    w = tl.load(w_rows + cols[None, :], mask=first_mask, other=0.0)
    if GATED:  # the up row of output i sits N rows below its gate row
        w_up = tl.load(w_rows + N * stride_w + cols[None, :], mask=first_mask, other=0.0)
    pdl_enter(PDL)
    rstd = 1.0
    if HAS_NORM:
        squares = tl.zeros([BLOCK_K], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            xk = tl.load(x_ptr + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
            squares += xk * xk
        rstd = 1.0 / tl.sqrt(tl.sum(squares, 0) / K + eps)
    xf = _x_tile(x_ptr, norm_ptr, 0, cols, rstd, K, HAS_NORM)
    acc = w.to(tl.float32) * xf
    if GATED:
        acc_up = w_up.to(tl.float32) * xf
    for k0 in range(BLOCK_K, K, BLOCK_K):
        xf = _x_tile(x_ptr, norm_ptr, k0, cols, rstd, K, HAS_NORM)
        mask = row_mask[:, None] & (k0 + cols < K)[None, :]
        w = tl.load(w_rows + k0 + cols[None, :], mask=mask, other=0.0)
        acc += w.to(tl.float32) * xf
        if GATED:
            w_up = tl.load(w_rows + N * stride_w + k0 + cols[None, :], mask=mask, other=0.0)
            acc_up += w_up.to(tl.float32) * xf
    y = tl.sum(acc, 1)  # [BLOCK_N]
    dtype = x_ptr.dtype.element_ty  # the activation dtype; the output may be fp32 logits
    if HAS_BIAS:
        y += tl.load(bias_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    y = y.to(dtype).to(tl.float32)
    if GATED:  # silu(gate) * up, each rounded like the unfused gate_up output and silu_mul
        up = tl.sum(acc_up, 1).to(dtype).to(tl.float32)
        act = (y / (1.0 + tl.exp(-y))).to(dtype).to(tl.float32)
        y = act * up
    if HAS_RESIDUAL:
        y += tl.load(residual_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=row_mask)
    if ARGMAX:
        slot = tl.program_id(0) % ARGMAX_SLOTS  # spread over slots: one address would serialize
        tl.atomic_max(argmax_ptr + slot, tl.max(_argmax_keys(y, rows, row_mask), 0), sem="relaxed")


@triton.jit
def _argmax_keys(y, rows, row_mask):
    """int64 keys whose maximum is the argmax of `y` at `rows`, first index on ties: the value's
    bits mapped to an order-preserving int32 in the high half, `0xFFFFFFFF - row` in the low half."""
    y = tl.where(y == 0.0, 0.0, y)  # -0.0 ties +0.0, as in torch.argmax
    bits = y.to(tl.int32, bitcast=True)
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # negatives: larger magnitude, smaller key
    key = tl.where(y != y, 0x7FFFFFFF, key)  # noqa: PLR0124 -- NaN is the maximum, as in torch.argmax
    packed = (key.to(tl.int64) << 32) | (4294967295 - rows.to(tl.int64))
    return tl.where(row_mask, packed, _INT64_MIN)


@triton.jit
def _argmax_finish_kernel(slots_ptr, ids_ptr, NUM_SLOTS: tl.constexpr, PDL: tl.constexpr):
    """One program: the best key of the slots -> the row index, then the slots back to empty."""
    pdl_enter(PDL)
    i = tl.arange(0, NUM_SLOTS)
    best = tl.max(tl.load(slots_ptr + i), 0)
    tl.store(ids_ptr, 4294967295 - (best & 4294967295))
    tl.store(slots_ptr + i, tl.full([NUM_SLOTS], _INT64_MIN, tl.int64))


# (BLOCK_N, BLOCK_K, num_warps): few rows per program and long contiguous row segments keep
# many 16-byte loads in flight; the best one is picked per matrix shape at the first call
# (the runner's warm-up forward, before any CUDA-graph capture).
_SHAPES = [
    (2, 512, 2),
    (2, 1024, 2),
    (4, 256, 2),
    (2, 2048, 4),
    (2, 1024, 4),
    (2, 2048, 8),
    (4, 512, 4),
    (4, 1024, 4),
    (4, 1024, 8),
    (8, 256, 4),
    (8, 512, 4),
    (8, 512, 8),
    (16, 256, 4),
    (16, 256, 8),
    (4, 2048, 8),
    (8, 1024, 8),
]
_KEY = ["N", "K", "HAS_NORM", "GATED"]


def _quick_bench(fn, quantiles=None, **_):
    # Short timings: each of the ~10 configs costs ~25 ms instead of ~125 ms at start-up.
    return triton.testing.do_bench(fn, warmup=5, rep=20, quantiles=quantiles)


_CONFIGS = [triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w) for n, k, w in _SHAPES]
_tuned_kernel = triton.autotune(_CONFIGS, key=_KEY, do_bench=_quick_bench)(_gemv_kernel)
# The greedy head accumulates into its slots: each timing run starts from the same slots.
_tuned_argmax_kernel = triton.autotune(
    _CONFIGS, key=_KEY, do_bench=_quick_bench, restore_value=["argmax_ptr"]
)(_gemv_kernel)


# Weights up to this size (MB) load whole before the PDL wait: every program takes one full row
# segment (BLOCK_K >= K), so the whole matrix is read while the kernels before it still run.
FULL_K_MAX_MB = switches().gemv_full_k_max_mb
# The one-token LM head as a GEMV with its argmax fused (logits_argmax); else cuBLAS.
HEAD_ENABLED = switches().is_gemv_head_enabled


@functools.cache
def _full_k_kernel(block_k: int):
    # At most 128 bytes of weight per thread: the tile stays in registers without spilling.
    configs = [
        triton.Config({"BLOCK_N": n, "BLOCK_K": block_k}, num_warps=w)
        for n in (2, 4, 8)
        for w in (2, 4, 8)
        if n * block_k * 2 <= 128 * 32 * w
    ]
    return triton.autotune(configs, key=_KEY, do_bench=_quick_bench)(_gemv_kernel)


def can_use_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """One 16-bit token row on CUDA against a plain row-major weight."""
    return x.is_cuda and x.dim() == 2 and x.shape[0] == 1 and fits_weight(weight, x.dtype)


def fits_weight(weight: torch.Tensor, dtype: torch.dtype) -> bool:
    """`weight` can take rows of `dtype`: both 16-bit and the same, the weight row-major."""
    return dtype in (torch.bfloat16, torch.float16) and weight.dtype == dtype and weight.stride(-1) == 1


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    residual: torch.Tensor | None = None,
    gated: bool = False,
    out_dtype: torch.dtype | None = None,
    argmax_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [1, K] -> [1, N]: `norm(x) @ weight.T (+ bias)`, then `silu(gate) * up` when `gated`
    (weight [2N, K], gate rows first), then `+ residual` ([1, N]). `norm` is HF's RMSNorm with
    `norm_weight` ([K]), skipped when None. The output is rounded to x's dtype and stored in
    `out_dtype` (default x's). With `argmax_slots` ([ARGMAX_SLOTS] int64, see logits_argmax) each
    program also merges its rows' argmax key into them."""
    num_rows, k = weight.shape
    n = num_rows // 2 if gated else num_rows
    x = x.contiguous()  # a no-op for the layer's own tensors; the kernel reads unit strides
    residual = residual.contiguous() if residual is not None else None
    assert x.shape == (1, k) and (residual is None or residual.shape == (1, n))
    assert not (gated and bias is not None), "no gated projection here has a bias"
    out = torch.empty(1, n, dtype=out_dtype or x.dtype, device=x.device)
    args = (
        x,
        weight,
        out,
        norm_weight if norm_weight is not None else x,
        residual if residual is not None else x,
    )
    flags = {
        "K": k,
        "HAS_NORM": norm_weight is not None,
        "HAS_RESIDUAL": residual is not None,
        "HAS_BIAS": bias is not None,
        "GATED": gated,
        "ARGMAX": argmax_slots is not None,
        "PDL": use_pdl(x),
    }
    bias_arg = bias if bias is not None else x
    slots_arg = argmax_slots if argmax_slots is not None else x
    if INTERPRETING:
        block_n, block_k = 4, min(128, triton.next_power_of_2(k))
        grid = (triton.cdiv(n, block_n),)
        _gemv_kernel[grid](
            *args, bias_arg, slots_arg, eps, n, weight.stride(0), **flags, BLOCK_N=block_n, BLOCK_K=block_k
        )
        return out

    def grid(meta: dict) -> tuple[int]:
        return (triton.cdiv(n, meta["BLOCK_N"]),)

    kernel = _tuned_kernel if argmax_slots is None else _tuned_argmax_kernel
    if (
        argmax_slots is None
        and not gated
        and weight.numel() * weight.element_size() <= FULL_K_MAX_MB * 2**20
        and k <= 4096
    ):
        kernel = _full_k_kernel(triton.next_power_of_2(k))
    kernel[grid](*args, bias_arg, slots_arg, eps, n, weight.stride(0), **flags, launch_pdl=flags["PDL"])
    return out


def empty_argmax_slots(device: torch.device) -> torch.Tensor:
    """The slots logits_argmax needs, empty; it leaves them empty again after each call."""
    return torch.full((ARGMAX_SLOTS.value,), -(2**63), dtype=torch.int64, device=device)


def logits_argmax(
    x: torch.Tensor, weight: torch.Tensor, slots: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The LM head of one token with its greedy pick: x [1, K] -> (float32 logits [1, V], rounded
    like `F.linear(x, weight).float()`, and their argmax [1] int64, first index on ties).

    Why fused: the separate path is a cuBLAS GEMV, a cast and five small argmax kernels, ~2 us of
    launch each in a decode step. Here the GEMV programs merge their rows' best (value, index)
    key into `slots` by atomic max and one more program reads the winner and empties the slots."""
    logits = gemv(x, weight, out_dtype=torch.float32, argmax_slots=slots)
    ids = torch.empty(1, dtype=torch.int64, device=x.device)
    pdl = use_pdl(x)
    _argmax_finish_kernel[(1,)](slots, ids, NUM_SLOTS=ARGMAX_SLOTS.value, PDL=pdl, launch_pdl=pdl)
    return logits, ids
