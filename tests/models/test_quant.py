"""Weight-only int8/int4 linears: close to the dense layer, dense path above the row threshold."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kvserve.models.layers.quant import WeightOnlyLinear, quantize_int4


@pytest.mark.parametrize("scheme,tolerance", [("int8", 0.02), ("int4", 0.15)])
def test_quantized_matches_dense_within_quantization_error(scheme: str, tolerance: float) -> None:
    torch.manual_seed(0)
    weight = (torch.randn(96, 128) * 0.05).bfloat16()
    bias = torch.randn(96).bfloat16()
    layer = WeightOnlyLinear(weight, bias, scheme, max_quant_rows=4)
    x = torch.randn(3, 128).bfloat16()
    dense = torch.nn.functional.linear(x.float(), weight.float(), bias.float())
    quantized = layer(x).float()
    rel = (quantized - dense).norm() / dense.norm()
    assert rel < tolerance
    assert not torch.equal(quantized, dense.bfloat16().float())  # the low-bit kernel really ran


def test_large_batches_use_the_dense_weight() -> None:
    torch.manual_seed(0)
    weight = torch.randn(64, 64).bfloat16()
    layer = WeightOnlyLinear(weight, None, "int4", max_quant_rows=4)
    x = torch.randn(8, 64).bfloat16()
    assert torch.equal(layer(x), torch.nn.functional.linear(x, weight))


def test_int4_is_exact_on_a_q4_grid() -> None:
    """Weights already on a 16-level grid per group of 32 (a Q4_1 checkpoint) survive packing."""
    torch.manual_seed(0)
    q = torch.randint(0, 16, (32, 64)).float()
    q[:, ::32] = 0
    q[:, 1::32] = 15  # every group spans the full grid, as a Q4_1 quantizer produces
    scale, minimum = 0.0625, -0.5  # exactly representable in bf16
    weight = (q * scale + minimum).bfloat16()
    packed, scales_and_zeros = quantize_int4(weight)
    x = torch.eye(64).bfloat16()[:8]
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 32, scales_and_zeros)
    assert torch.equal(out, weight[:, :8].t())


@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_bf16_prefill_keeps_fp32_decode_and_runs_prompt_batches_in_bf16(scheme: str) -> None:
    """`bf16_prefill` (an fp32 engine on an AVX512-BF16/AMX CPU): decode-sized batches still run the
    fp32 low-bit kernel, bit for bit; prompt-sized ones run the dense GEMM on bf16 weights, whose
    output comes back in fp32."""
    torch.manual_seed(0)
    weight = torch.randn(64, 96) * 0.05
    bias = torch.randn(64)
    plain = WeightOnlyLinear(weight, bias, scheme, max_quant_rows=4)
    halved = WeightOnlyLinear(weight, bias, scheme, max_quant_rows=4, bf16_prefill=True)
    assert halved.weight.dtype == torch.bfloat16 and plain.weight.dtype == torch.float32
    small = torch.randn(3, 96)
    assert torch.equal(halved(small), plain(small))
    large = torch.randn(8, 96)
    out = halved(large)
    expected = torch.nn.functional.linear(large.bfloat16(), weight.bfloat16(), bias.bfloat16()).float()
    assert out.dtype == torch.float32 and torch.equal(out, expected)
    assert not torch.equal(out, plain(large))  # the bf16 GEMM really ran


def test_bf16_prefill_gate_up_keeps_its_bf16_output_for_down_proj() -> None:
    """Under bf16_prefill the MLP stays in bf16 between its GEMMs: gate/up hands its bf16 output on
    as it is (for prompt batches only), down_proj takes bf16 in and gives the residual stream fp32,
    and every apply_weight_quant'ed model wires it so (only gate_up_proj keeps bf16)."""

    from kvserve.models.common import MLP
    from kvserve.models.config import ModelArchConfig
    from kvserve.models.layers.quant import apply_weight_quant

    torch.manual_seed(0)
    arch = ModelArchConfig(
        architecture="llama", vocab_size=32, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, rms_norm_eps=1e-6, rope_theta=1e4,
        max_position_embeddings=64,
    )  # fmt: skip
    mlp = MLP(arch)
    for p in mlp.parameters():
        nn.init.normal_(p, std=0.05)
    x = torch.randn(20, 64)  # > max_quant_rows: the dense path
    gate_up, down = mlp.gate_up_proj.weight.detach().clone(), mlp.down_proj.weight.detach().clone()
    holder = nn.Module()
    holder.mlp = mlp
    apply_weight_quant(holder, "int4", quantize_head=False, bf16_prefill=True)
    assert mlp.gate_up_proj.keep_prefill_dtype and not mlp.down_proj.keep_prefill_dtype
    hidden = mlp.gate_up_proj(x)
    assert hidden.dtype == torch.bfloat16
    out = mlp(x)
    g, u = torch.nn.functional.linear(x.bfloat16(), gate_up.bfloat16()).chunk(2, dim=-1)
    expected = torch.nn.functional.linear(torch.nn.functional.silu(g) * u, down.bfloat16()).float()
    assert out.dtype == torch.float32 and torch.equal(out, expected)
    assert mlp.down_proj(x[:3, :48].repeat(1, 2)).dtype == torch.float32  # decode rows: fp32 kernel


@pytest.mark.parametrize("way", ["this-cpu", "blocks", "blocks-packed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_dense_rows_do_not_depend_on_how_many_come_together(dtype: torch.dtype, way: str) -> None:
    """A prompt's few-token tail (after a prefix hit) must get the bits the same tokens get inside a
    larger batch, and a row must not depend on the rows beside it: the CPU GEMMs pick their kernel by
    row count (AVX2 fp32: rows 1-3 of a 1536 x 576 product differed; AMX bf16: 3 rows and up, fp32
    57 and up at 2 threads, whatever the padding), which int4 decode's int8 activations turned into
    other greedy tokens. This CPU's way (`row_block()`) and fixed blocks, which hold on every CPU."""
    from kvserve.models.layers.quant import ROW_BLOCK, _dense_rows, pack_dense_weight, row_block

    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(1536, 576, generator=gen).to(dtype)
    bias = torch.randn(1536, generator=gen).to(dtype)
    block = row_block() if way == "this-cpu" else ROW_BLOCK
    pack = pack_dense_weight(weight) if way != "blocks" else None
    if way == "blocks-packed" and pack is None:
        pytest.skip("oneDNN packs no weight of this dtype on this CPU (bf16 on AVX-512 only)")
    x = torch.randn(4 * ROW_BLOCK + 9, 576, generator=gen)
    full = _dense_rows(x, weight, bias, x.dtype, pack, block)
    assert full.dtype == x.dtype
    for rows in (1, 2, 3, 15, 16, 17, 40, 57, 63, 64, 65, 100, 131, 200):
        for start in (0, 5):
            part = _dense_rows(x[start : start + rows], weight, bias, x.dtype, pack, block)
            assert torch.equal(part, full[start : start + rows]), (rows, start)
    # The same product as one F.linear, up to its rounding.
    torch.testing.assert_close(full, F.linear(x.to(dtype), weight, bias).to(x.dtype), rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_dense_engines_rows_do_not_depend_on_the_rows_beside_them(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dense CPU engine (--weight-quant none) wraps its projections in DenseRowsLinear: a decode
    step's row (up to MAX_DECODE_ROWS of them) and a prompt's row get the same bits however many
    rows share the call. Plain
    F.linear does not promise it: fp32 rows 1-3 of a 1536 x 576 product differ from a larger call's
    on the AVX512-BF16 EPYC, bf16 rows from 3 up on a Xeon with AMX (where the crash harness's
    cached turn answered otherwise than the cold server)."""
    from kvserve.models.layers import quant

    gen = torch.Generator().manual_seed(1)
    linear = nn.Linear(576, 1536).to(dtype)
    layer = quant.DenseRowsLinear(linear)
    assert layer.weight is linear.weight and layer.bias is linear.bias  # the layer's own parameters
    x = torch.randn(2 * quant.ROW_BLOCK + 9, 576, generator=gen).to(dtype)
    with torch.no_grad():
        decode = layer(x[: quant.MAX_DECODE_ROWS])  # outside a prompt step: decode rows
        for rows in (1, 2, 3, 4, 5, 8, 11):
            for start in (0, 5):
                assert torch.equal(layer(x[start : start + rows]), decode[start : start + rows]), (
                    rows,
                    start,
                )
        monkeypatch.setattr(quant, "step_computes_prompt", lambda: True)
        prompt = layer(x)
        for rows in (1, 3, 17, 100, 131):
            for start in (0, 5):
                assert torch.equal(layer(x[start : start + rows]), prompt[start : start + rows]), (
                    rows,
                    start,
                )
        torch.testing.assert_close(prompt, linear(x), rtol=2e-2, atol=5e-2)
        torch.testing.assert_close(decode, linear(x[: len(decode)]), rtol=2e-2, atol=5e-2)
