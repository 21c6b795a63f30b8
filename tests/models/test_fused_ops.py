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
# YaRN: its attention factor scales the tables, which every fused kernel below must carry through.
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}


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


@pytest.mark.parametrize("scaling", [None, YARN])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_matches_torch(dtype: torch.dtype, scaling: dict | None) -> None:
    qkv = torch.randn(7, 6 + 2 * 2, 32, device=DEVICE).to(dtype)
    qk = qkv[:, :8]  # a strided view, as in the attention layer
    rope = RotaryEmbedding(32, 10_000.0, scaling).to(DEVICE)
    cos, sin = rope(torch.arange(3000, 3007, device=DEVICE), dtype)
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


@pytest.mark.skipif(not IS_CUDA, reason="libdevice cos/sin: CUDA only")
@pytest.mark.parametrize("scaling", [None, YARN])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_tables_match_torch(dtype: torch.dtype, scaling: dict | None) -> None:
    rope = RotaryEmbedding(64, 500_000.0, scaling).to(DEVICE)
    positions = torch.tensor([0, 1, 7, 130, 4095, 131_071], device=DEVICE)
    cos, sin = rope(positions, dtype)  # on CUDA the layer takes the fused kernel
    assert torch.equal(cos, fused_ops.rope_tables(positions, rope.inv_freq, dtype, rope.attention_factor)[0])
    enabled, fused_ops.ENABLED = fused_ops.ENABLED, False
    try:
        want_cos, want_sin = rope(positions, dtype)
    finally:
        fused_ops.ENABLED = enabled
    assert cos.shape == want_cos.shape == (6, 1, 64) and cos.dtype == dtype
    # The same fp32 products and libdevice functions: equal, up to one fp32 ulp where torch's
    # kernel is compiled with a different contraction.
    torch.testing.assert_close(cos, want_cos, atol=1e-6, rtol=0)
    torch.testing.assert_close(sin, want_sin, atol=1e-6, rtol=0)


@pytest.mark.parametrize("scaling", [None, YARN])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_with_kv_write_matches_rotary_then_write(dtype: torch.dtype, scaling: dict | None) -> None:
    from kvserve.models.layers.attention.torch_ref import TorchRefBackend

    num_heads, num_kv_heads, head_dim = 6, 2, 32
    qkv = torch.randn(5, num_heads + 2 * num_kv_heads, head_dim, device=DEVICE).to(dtype)
    qk, v = qkv[:, : num_heads + num_kv_heads], qkv[:, num_heads + num_kv_heads :]
    rope = RotaryEmbedding(head_dim, 10_000.0, scaling).to(DEVICE)
    cos, sin = rope(torch.arange(2000, 2005, device=DEVICE), dtype)
    slots = torch.tensor([3, 17, -1, 40, 8], device=DEVICE)  # -1: a padded row writes nothing
    cache = torch.zeros(2, 4, 16, num_kv_heads, head_dim, device=DEVICE, dtype=dtype)
    got = fused_ops.rotary(qk, cos, sin, kv_cache=cache, v=v, slot_mapping=slots)
    want = fused_ops.rotary(qk, cos, sin)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    expected = torch.zeros_like(cache)
    keep = slots >= 0
    TorchRefBackend().write_kv(expected, want[keep, num_heads:], v[keep], slots[keep])
    torch.testing.assert_close(cache, expected, atol=0, rtol=0)
