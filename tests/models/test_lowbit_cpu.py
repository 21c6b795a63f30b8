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
    # Gemma 3: GELU-tanh gate, and RMSNorm of the output before the residual add.
    "norm_gelu": {"norm_weight": True, "gated": True, "act": "gelu_pytorch_tanh"},
    "post_norm_residual": {"post_norm": True, "residual": True, "eps": 1e-5},
    "gelu_post_norm": {"gated": True, "act": "gelu_pytorch_tanh", "post_norm": True},
}


@needs_kernel
def _fusion_kwargs(fusion: dict, n: int, k: int, rows: int, out_n: int) -> dict:
    """lowbit_linear's fused neighbours for one FUSIONS case, with random tensors."""
    return {
        "bias": torch.randn(n) if fusion.get("bias") else None,
        "residual": torch.randn(rows, out_n) if fusion.get("residual") else None,
        "norm_weight": torch.rand(k) + 0.5 if fusion.get("norm_weight") else None,
        "eps": fusion.get("eps", 1e-6),
        "gated": bool(fusion.get("gated")),
        "act": fusion.get("act", "silu"),
        "post_norm": torch.rand(out_n) + 0.5 if fusion.get("post_norm") else None,
        "post_eps": fusion.get("eps", 1e-6),
    }


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows", [1, 2, 7, 16])  # the kernel takes rows 4 at a time: 1, 2, 3 left
@pytest.mark.parametrize("fusion", FUSIONS.values(), ids=FUSIONS.keys())
def test_kernel_matches_its_reference(bits: lowbit_cpu.Bits, rows: int, fusion: dict) -> None:
    torch.manual_seed(bits + rows)
    n, k = 80, 320  # 10 groups: exercises the kernel's 8-group scale loop and its tail
    qweight, scales = lowbit_cpu.quantize(torch.randn(n, k) * 0.05, bits)
    out_n = n // 2 if fusion.get("gated") else n
    kwargs = _fusion_kwargs(fusion, n, k, rows, out_n)
    x = torch.randn(rows, k)
    out = lowbit_cpu.lowbit_linear(x, qweight, scales, bits, **kwargs)
    expected = lowbit_cpu.reference_linear(x, qweight, scales, bits, **kwargs)
    assert out.shape == (rows, out_n)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("scheme,int8_prefill", [("int4", False), ("int8", False), ("int4", True)])
def test_fp32_layer_uses_the_kernel_up_to_its_row_limit(scheme: str, int8_prefill: bool) -> None:
    torch.manual_seed(0)
    weight, bias = torch.randn(64, 64) * 0.05, torch.randn(64)
    layer = WeightOnlyLinear(weight, bias, scheme, max_quant_rows=4, int8_prefill=int8_prefill)
    bits = layer.bits
    assert bits == (4 if scheme == "int4" else 8)
    small, large = torch.randn(4, 64), torch.randn(5, 64)
    expected = lowbit_cpu.reference_linear(small, layer.qweight, layer.scales, bits, bias)
    torch.testing.assert_close(layer(small), expected, atol=1e-4, rtol=1e-4)
    if not int8_prefill or cpu_ext.load() is None:  # above the limit: the dense GEMM
        # with each row's bits as inside a larger batch (torch takes another kernel below 16 rows
        # on some CPUs, so a 5-row F.linear is not the reference)
        batch = torch.cat([large, torch.randn(27, 64)])
        assert torch.equal(layer(large), torch.nn.functional.linear(batch, weight, bias)[:5])
    else:  # the int4 prefill GEMM: the small-batch kernel's math
        expected = lowbit_cpu.reference_linear(large, layer.qweight, layer.scales, bits, bias)
        torch.testing.assert_close(layer(large), expected, atol=1e-4, rtol=1e-4)


def test_gemm_packing_keeps_every_weight() -> None:
    """pack_for_gemm's blocked layout (csrc/lowbit_gemm.h), decoded in torch, is the same int4 weight."""
    torch.manual_seed(0)
    n, k = 13, 96  # a padded last block of 8 rows, 3 groups
    qweight, scales = lowbit_cpu.quantize(torch.randn(n, k), 4)
    gemm_q, gemm_scales = lowbit_cpu.pack_for_gemm(qweight, scales)
    assert gemm_q.shape == (2, 3, 4, 32) and gemm_scales.shape == (2, 3, 2, 8)
    nibbles = torch.stack([gemm_q & 0x0F, gemm_q >> 4], dim=2).view(2, 3, 2, 4, 8, 4)  # [b, g, half, j, i, t]
    q = nibbles.permute(0, 4, 1, 2, 3, 5).reshape(16, k).float()  # [n, k]: k = 32g + 16 half + 4j + t
    d, m = (
        gemm_scales[:, :, 0].permute(0, 2, 1).reshape(16, 3),
        gemm_scales[:, :, 1].permute(0, 2, 1).reshape(16, 3),
    )
    weight = (q.view(16, 3, 32) * d[..., None] + m[..., None]).view(16, k)
    assert torch.equal(weight[:n], lowbit_cpu.dequantize(qweight, scales, 4))
    assert not weight[n:].any()


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 4, 17, 64, 65, 130])  # 4-row tiles, 64-row chunks: every tail
@pytest.mark.parametrize("n,k", [(40, 320), (13, 32), (8, 96)])  # a padded block of 8 outputs; 1-10 groups
@pytest.mark.parametrize("has_bias", [False, True])
def test_gemm_matches_the_reference(rows: int, n: int, k: int, has_bias: bool) -> None:
    torch.manual_seed(rows + n)
    qweight, scales = lowbit_cpu.quantize(torch.randn(n, k) * 0.05, 4)
    bias = torch.randn(n) if has_bias else None
    x = torch.randn(rows, k)
    x[:, 5] *= 30  # one large group: its int8 step differs from the others'
    out = lowbit_cpu.lowbit_gemm(x, *lowbit_cpu.pack_for_gemm(qweight, scales), n, bias)
    assert out is not None and out.shape == (rows, n)
    expected = lowbit_cpu.reference_linear(x, qweight, scales, 4, bias)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    decode = lowbit_cpu.lowbit_linear(x[:4], qweight, scales, 4, bias)  # the decode kernel: same math
    torch.testing.assert_close(out[:4], decode, atol=1e-4, rtol=1e-4)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 7, 16])
def test_kernel_with_fp32_input_matches_its_reference(rows: int) -> None:
    """The LM head's path: int8 weights, activations not rounded (close to the dequantized GEMV)."""
    torch.manual_seed(rows)
    qweight, scales = lowbit_cpu.quantize(torch.randn(48, 320) * 0.05, 8)
    x = torch.randn(rows, 320)
    out = lowbit_cpu.lowbit_linear(x, qweight, scales, 8, quantize_x=False)
    torch.testing.assert_close(out, x @ lowbit_cpu.dequantize(qweight, scales, 8).t(), atol=1e-5, rtol=1e-5)


def _unpack_for_decode(
    packed: torch.Tensor, n: int, bits: lowbit_cpu.Bits
) -> tuple[torch.Tensor, torch.Tensor]:
    """pack_for_decode's x4 layout back to (qweight, scales) rows, written from the layout's
    description (csrc/lowbit_x4.h) rather than by inverting the packing code."""
    quant_bytes = 16 if bits == 4 else 32
    blocks, num_groups = packed.shape[0], packed.shape[1] // (8 + 4 * quant_bytes + (8 if bits == 4 else 0))
    records = packed[:, : num_groups * (8 + 4 * quant_bytes)].reshape(blocks, num_groups, -1)
    d = records[..., :8].contiguous().view(torch.float16).transpose(1, 2).reshape(blocks * 4, 1, num_groups)
    quants = records[..., 8:].reshape(blocks, num_groups, 4, quant_bytes).transpose(1, 2)
    qweight = quants.reshape(blocks * 4, num_groups * quant_bytes)[:n]
    if bits == 8:
        return qweight.view(torch.int8), d[:n, 0]
    mins = packed[:, records.shape[1] * records.shape[2] :].contiguous().view(torch.float16)  # [b, 4 * G]
    return qweight, torch.cat([d, mins.reshape(blocks * 4, 1, num_groups)], dim=1)[:n]


@pytest.mark.parametrize("bits", [4, 8])
def test_decode_packing_keeps_every_weight(bits: lowbit_cpu.Bits) -> None:
    torch.manual_seed(bits)
    n, k = 13, 96  # a padded last block of 4 rows, 3 groups
    qweight, scales = lowbit_cpu.quantize(torch.randn(n, k), bits)
    packed = lowbit_cpu.pack_for_decode(qweight, scales, bits)
    assert packed.shape == (4, 3 * (80 if bits == 4 else 136)) and packed.dtype == torch.uint8
    q, s = _unpack_for_decode(packed, n, bits)
    assert torch.equal(q, qweight) and torch.equal(s, scales)
    padding = _unpack_for_decode(packed, 16, bits)
    assert not padding[0][n:].view(torch.uint8).any() and not padding[1][n:].any()


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 7, 16])
@pytest.mark.parametrize(
    "n", [80, 13, 84]
)  # 13: a padded block; 84 gated: an up half off a block (row layout)
@pytest.mark.parametrize("fusion", FUSIONS.values(), ids=FUSIONS.keys())
def test_packed_int4_kernel_matches_its_reference(rows: int, n: int, fusion: dict) -> None:
    """The x4 layout's kernel (one row), with the row-layout weights zeroed: a wrong layout cannot pass.
    Several rows, and an up half off a block of 4 rows, keep the row layout."""
    if fusion.get("gated") and n % 2:
        pytest.skip("gated needs an even N")
    torch.manual_seed(rows + n)
    k = 320
    qweight, scales = lowbit_cpu.quantize(torch.randn(n, k) * 0.05, 4)
    packed = lowbit_cpu.pack_for_decode(qweight, scales, 4)
    out_n = n // 2 if fusion.get("gated") else n
    kwargs = _fusion_kwargs(fusion, n, k, rows, out_n)
    x = torch.randn(rows, k)
    expected = lowbit_cpu.reference_linear(x, qweight, scales, 4, **kwargs)
    reads_packed = rows == 1 and not (kwargs["gated"] and (n // 2) % 4)
    row_layout = torch.zeros_like(qweight) if reads_packed else qweight
    out = lowbit_cpu.lowbit_linear(x, row_layout, scales, 4, **kwargs, packed=packed)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])  # 8: the LM head (fp32 input)
@pytest.mark.parametrize("k", [320, 576, 96])  # 10, 18 (SmolLM2) and 3 groups: every tail of the 8-wide loops
@pytest.mark.parametrize("gated", [False, True])
def test_packed_kernel_equals_the_row_layout(bits: lowbit_cpu.Bits, k: int, gated: bool) -> None:
    """The x4 layout gives the row layout's result bit for bit (the float operations in the same
    order): greedy answers must not move with the layout."""
    if gated and bits == 8:
        pytest.skip("fp32 input: the LM head, never gated")
    torch.manual_seed(k)
    n = 56
    qweight, scales = lowbit_cpu.quantize(torch.randn(n, k) * 0.05, bits)
    packed = lowbit_cpu.pack_for_decode(qweight, scales, bits)
    x = torch.randn(1, k)
    kwargs = {"quantize_x": bits == 4, "bias": torch.randn(n), "gated": gated}
    out = lowbit_cpu.lowbit_linear(x, torch.zeros_like(qweight), scales, bits, **kwargs, packed=packed)
    assert torch.equal(out, lowbit_cpu.lowbit_linear(x, qweight, scales, bits, **kwargs))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows", [1, 3, 16])
def test_the_thread_count_does_not_change_the_bits(bits: int, rows: int) -> None:
    """Each output row is one thread's, with the same float operations whatever the split: answers do
    not depend on --threads."""
    if cpu_ext.load() is None:
        pytest.skip("no AVX2 CPU kernels here")
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(512, 256, generator=gen) * 0.05
    qweight, scales = lowbit_cpu.quantize(weight, bits)
    packed = lowbit_cpu.pack_for_decode(qweight, scales, bits) if bits == 4 else None
    x = torch.randn(rows, 256, generator=gen)
    norm = torch.rand(256, generator=gen) + 0.5
    threads = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            outs.append(
                lowbit_cpu.lowbit_linear(x, qweight, scales, bits, None, norm_weight=norm, packed=packed)
            )
            outs.append(lowbit_cpu.lowbit_linear(x, qweight, scales, bits, None, gated=True, packed=packed))
    finally:
        torch.set_num_threads(threads)
    for i, out in enumerate(outs[2:], start=2):
        assert torch.equal(out, outs[i % 2])
