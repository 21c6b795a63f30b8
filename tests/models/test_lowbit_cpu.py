"""The fp32 low-bit linears (lowbit_cpu): packing, the C++ kernel against its torch reference,
and the layer's dispatch between the kernel and the dense weight."""

from __future__ import annotations

import pytest
import torch

from kvserve.models.layers import cpu_ext, lowbit_cpu
from kvserve.models.layers.quant import WeightOnlyLinear

needs_kernel = pytest.mark.skipif(cpu_ext.load() is None, reason="no AVX2 CPU kernels here")


def test_int4_is_exact_on_a_q4_grid() -> None:
    """Weights already on a 16-level grid per group of 32 (a Q4_1 checkpoint) survive packing."""
    torch.manual_seed(0)
    q = torch.randint(0, 16, (8, 64)).float()
    q[:, ::32], q[:, 1::32] = 0, 15  # every group spans the full grid
    weight = q * 0.0625 - 0.5  # exactly representable in fp16
    packed, scales = lowbit_cpu.quantize(weight, 4)
    assert packed.shape == (8, 32) and scales.shape == (8, 2, 2)
    assert torch.equal(lowbit_cpu.dequantize(packed, scales, 4), weight)


@pytest.mark.parametrize("bits,tolerance", [(8, 0.01), (4, 0.1)])
def test_reference_is_close_to_dense(bits: lowbit_cpu.Bits, tolerance: float) -> None:
    torch.manual_seed(0)
    weight, x = torch.randn(96, 128) * 0.05, torch.randn(3, 128)
    out = lowbit_cpu.reference_linear(x, *lowbit_cpu.quantize(weight, bits), bits)
    dense = x @ weight.t()
    assert (out - dense).norm() / dense.norm() < tolerance


FUSIONS = {
    "plain": {},
    "bias": {"bias": True},
    "norm": {"norm_weight": True, "eps": 1e-5},
    "gated_residual": {"gated": True, "residual": True},
    "norm_gated": {"norm_weight": True, "gated": True},
}


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows", [1, 2, 7, 16])  # the kernel takes rows 4 at a time: 1, 2, 3 left
@pytest.mark.parametrize("fusion", FUSIONS.values(), ids=FUSIONS.keys())
def test_kernel_matches_its_reference(bits: lowbit_cpu.Bits, rows: int, fusion: dict) -> None:
    torch.manual_seed(bits + rows)
    n, k = 80, 320  # 10 groups: exercises the kernel's 8-group scale loop and its tail
    qweight, scales = lowbit_cpu.quantize(torch.randn(n, k) * 0.05, bits)
    out_n = n // 2 if fusion.get("gated") else n
    kwargs = {
        "bias": torch.randn(n) if fusion.get("bias") else None,
        "residual": torch.randn(rows, out_n) if fusion.get("residual") else None,
        "norm_weight": torch.rand(k) + 0.5 if fusion.get("norm_weight") else None,
        "eps": fusion.get("eps", 1e-6),
        "gated": bool(fusion.get("gated")),
    }
    x = torch.randn(rows, k)
    out = lowbit_cpu.lowbit_linear(x, qweight, scales, bits, **kwargs)
    expected = lowbit_cpu.reference_linear(x, qweight, scales, bits, **kwargs)
    assert out.shape == (rows, out_n)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_fp32_layer_uses_the_kernel_up_to_its_row_limit() -> None:
    torch.manual_seed(0)
    weight, bias = torch.randn(64, 64) * 0.05, torch.randn(64)
    layer = WeightOnlyLinear(weight, bias, "int4", max_quant_rows=4)
    assert layer.bits == 4
    small, large = torch.randn(4, 64), torch.randn(5, 64)
    expected = lowbit_cpu.reference_linear(small, layer.qweight, layer.scales, 4, bias)
    torch.testing.assert_close(layer(small), expected, atol=1e-4, rtol=1e-4)
    assert torch.equal(layer(large), torch.nn.functional.linear(large, weight, bias))


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 7, 16])
def test_kernel_with_fp32_input_matches_its_reference(rows: int) -> None:
    """The LM head's path: int8 weights, activations not rounded (close to the dequantized GEMV)."""
    torch.manual_seed(rows)
    qweight, scales = lowbit_cpu.quantize(torch.randn(48, 320) * 0.05, 8)
    x = torch.randn(rows, 320)
    out = lowbit_cpu.lowbit_linear(x, qweight, scales, 8, quantize_x=False)
    torch.testing.assert_close(out, x @ lowbit_cpu.dequantize(qweight, scales, 8).t(), atol=1e-5, rtol=1e-5)


def _head_case(n: int, k: int, rows: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    qweight, scales = lowbit_cpu.quantize(torch.randn(n, k, generator=gen) * 0.05, 8)
    x = torch.randn(rows, k, generator=gen)
    x[:, 3] *= 20  # an outlier dimension, as final hidden states have: a coarse int8 step
    return x, qweight, scales, lowbit_cpu.row_l1(qweight, scales, 8)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 16])  # rows 4 at a time: every tail, a lone last row
@pytest.mark.parametrize("n,k", [(1000, 320), (67, 64), (49, 32)])  # odd N (parallel chunks), 1-10 groups
def test_head_is_exact_at_the_argmax(rows: int, n: int, k: int) -> None:
    """head_logits' top logit is lowbit_linear(quantize_x=False)'s, bit for bit; the rest within its bound."""
    x, qweight, scales, l1 = _head_case(n, k, rows, seed=rows * n)
    out = lowbit_cpu.head_logits(x, qweight, scales, l1)
    exact = lowbit_cpu.lowbit_linear(x, qweight, scales, 8, quantize_x=False)
    assert torch.equal(out.argmax(dim=1), exact.argmax(dim=1))
    assert torch.equal(out.max(dim=1).values, exact.max(dim=1).values)
    step = x.abs().amax(dim=1, keepdim=True) / 127
    assert ((out - exact).abs() <= l1 * step * 0.51).all()


@needs_kernel
def test_head_argmax_survives_near_ties() -> None:
    """Rows that differ by less than the int8 path's error: the recomputed rows decide the argmax."""
    x, qweight, scales, _ = _head_case(64, 128, 4, seed=1)
    qweight[1:] = qweight[0]  # every row the same weights, scales apart by one fp16 ulp or two
    scales[:] = scales[0]
    scales[5:9] = (scales[5:9].float() * (1 + 2**-10)).half()
    scales[17] = (scales[17].float() * (1 - 2**-10)).half()
    l1 = lowbit_cpu.row_l1(qweight, scales, 8)
    out = lowbit_cpu.head_logits(x, qweight, scales, l1)
    exact = lowbit_cpu.lowbit_linear(x, qweight, scales, 8, quantize_x=False)
    assert torch.equal(out.argmax(dim=1), exact.argmax(dim=1))
    assert torch.equal(out.max(dim=1).values, exact.max(dim=1).values)


def test_fp32_head_layer_uses_the_exact_head() -> None:
    torch.manual_seed(0)
    layer = WeightOnlyLinear(torch.randn(96, 64) * 0.05, None, "int8", quantize_input=False)
    x = torch.randn(3, 64)
    expected = lowbit_cpu.reference_linear(x, layer.qweight, layer.scales, 8, quantize_x=False)
    torch.testing.assert_close(
        layer(x), expected, atol=float(x.abs().max() / 127 * layer.row_l1.max()), rtol=0
    )
    assert torch.equal(layer(x).argmax(dim=1), expected.argmax(dim=1))
