"""The Triton small-op kernels against the torch code they replace (interpreter on CPU)."""

from __future__ import annotations

import os

import pytest
import torch

IS_CUDA = torch.cuda.is_available()
if not IS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from kvserve.models.layers import fused_ops
from kvserve.models.layers.norm import RMSNorm
from kvserve.models.layers.rotary import RotaryEmbedding

DEVICE = "cuda" if IS_CUDA else "cpu"
# The interpreter truncates fp32 -> bf16 where the GPU rounds to nearest: bf16 runs on CUDA only.
_BF16 = pytest.param(
    torch.bfloat16, marks=pytest.mark.skipif(not IS_CUDA, reason="interpreter bf16 casts truncate")
)
DTYPES = [torch.float32, _BF16]


def _torch_norm(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    fused_ops_enabled, fused_ops.ENABLED = fused_ops.ENABLED, False
    try:
        return norm(x)
    finally:
        fused_ops.ENABLED = fused_ops_enabled


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_with_residual(dtype: torch.dtype) -> None:
    norm = RMSNorm(96, 1e-5).to(DEVICE, dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(96) * 0.3 + 1)
    x = torch.randn(5, 96, device=DEVICE).to(dtype)
    residual = torch.randn(5, 96, device=DEVICE).to(dtype)
    with torch.no_grad():
        out, total = fused_ops.rms_norm(x, norm.weight, norm.eps, residual)
        plain, _ = fused_ops.rms_norm(x, norm.weight, norm.eps)
        torch.testing.assert_close(total, x + residual, atol=0, rtol=0)
        tol = 1e-5 if dtype == torch.float32 else 1e-2  # one bf16 ulp where the fp32 sum order differs
        torch.testing.assert_close(out, _torch_norm(norm, x + residual), atol=tol, rtol=tol)
        torch.testing.assert_close(plain, _torch_norm(norm, x), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_matches_torch(dtype: torch.dtype) -> None:
    qkv = torch.randn(7, 6 + 2 * 2, 32, device=DEVICE).to(dtype)
    qk = qkv[:, :8]  # a strided view, as in the attention layer
    cos, sin = RotaryEmbedding(32, 10_000.0).to(DEVICE)(torch.arange(3, 10, device=DEVICE), dtype)
    half = 16
    want = qk * cos + torch.cat((qk[..., half:], qk[..., :half]), dim=-1) * sin
    # Within an ulp: the GPU may contract the fp32 multiply-add, or round a bf16 product apart.
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(fused_ops.rotary(qk, cos, sin), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_matches_torch(dtype: torch.dtype) -> None:
    x = torch.randn(3, 2 * 1100, device=DEVICE).to(dtype)  # two column tiles, the second partial
    gate, up = x.chunk(2, dim=-1)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(fused_ops.silu_mul(x), torch.nn.functional.silu(gate) * up, atol=tol, rtol=tol)
