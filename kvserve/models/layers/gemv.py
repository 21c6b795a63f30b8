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

import torch
import triton
import triton.language as tl

from kvserve.models.layers.triton_launch import INTERPRETING, use_pdl


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
    eps,
    N,
    stride_w,
    K: tl.constexpr,
    HAS_NORM: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr,
    USE_PDL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    cols = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + rows[:, None].to(tl.int64) * stride_w
    # The first weight tile is loaded before waiting for the previous kernel (see pdl.py): weights
    # are never written, and its DRAM latency then overlaps the previous kernel's tail.
    first_mask = row_mask[:, None] & (cols[None, :] < K)
    w = tl.load(w_rows + cols[None, :], mask=first_mask, other=0.0)
    if GATED:  # the up row of output i sits N rows below its gate row
        w_up = tl.load(w_rows + N * stride_w + cols[None, :], mask=first_mask, other=0.0)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
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
    dtype = out_ptr.dtype.element_ty
    if HAS_BIAS:
        y += tl.load(bias_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    y = y.to(dtype).to(tl.float32)
    if GATED:  # silu(gate) * up, each rounded like the unfused gate_up output and silu_mul
        up = tl.sum(acc_up, 1).to(dtype).to(tl.float32)
        act = (y / (1.0 + tl.exp(-y))).to(dtype).to(tl.float32)
        y = act * up
    if HAS_RESIDUAL:
        y += tl.load(residual_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows, y.to(dtype), mask=row_mask)


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


def can_use_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """One 16-bit token row on CUDA against a plain row-major weight."""
    return (
        x.is_cuda
        and x.dim() == 2
        and x.shape[0] == 1
        and x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype == x.dtype
        and weight.stride(-1) == 1
    )


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    residual: torch.Tensor | None = None,
    gated: bool = False,
) -> torch.Tensor:
    """x [1, K] -> [1, N]: `norm(x) @ weight.T (+ bias)`, then `silu(gate) * up` when `gated`
    (weight [2N, K], gate rows first), then `+ residual` ([1, N]). `norm` is HF's RMSNorm with
    `norm_weight` ([K]), skipped when None."""
    num_rows, k = weight.shape
    n = num_rows // 2 if gated else num_rows
    x = x.contiguous()  # a no-op for the layer's own tensors; the kernel reads unit strides
    residual = residual.contiguous() if residual is not None else None
    assert x.shape == (1, k) and (residual is None or residual.shape == (1, n))
    assert not (gated and bias is not None), "no gated projection here has a bias"
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)
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
        "USE_PDL": use_pdl(x),
    }
    bias_arg = bias if bias is not None else x
    if INTERPRETING:
        block_n, block_k = 4, min(128, triton.next_power_of_2(k))
        grid = (triton.cdiv(n, block_n),)
        _gemv_kernel[grid](
            *args, bias_arg, eps, n, weight.stride(0), **flags, BLOCK_N=block_n, BLOCK_K=block_k
        )
        return out

    def grid(meta: dict) -> tuple[int]:
        return (triton.cdiv(n, meta["BLOCK_N"]),)

    _tuned_kernel[grid](*args, bias_arg, eps, n, weight.stride(0), **flags, launch_pdl=flags["USE_PDL"])
    return out
