"""The fused one-token GEMV kernels against the unfused torch ops they replace (interpreter on
CPU in fp32; bf16 and the decoder-layer fast path on CUDA)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

# The same CPU/CUDA set-up as the small-op kernels (TRITON_INTERPRET=1 on CPU, set before Triton loads).
from tests.models.test_fused_ops import _BF16, DEVICE, IS_CUDA  # isort: skip
from kvserve.models.layers import fused_ops, gemv  # isort: skip


def _hf_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


def _rand(*shape: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, device=DEVICE) * scale).to(dtype)


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    # fp32: only the summation order differs; bf16: about one ulp of the (rounded) output.
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


# Ragged sizes (not multiples of any block) and a longer K that takes several loop steps. N stays
# small: the CPU interpreter runs each block of rows as a program of its own, in Python.
SHAPES = [(37, 96), (64, 640), (45, 2048)]


@pytest.mark.parametrize("dtype", [torch.float32, _BF16])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_plain_bias_and_residual(dtype: torch.dtype, n: int, k: int) -> None:
    x, w = _rand(1, k, dtype=dtype), _rand(n, k, dtype=dtype, scale=k**-0.5)
    bias, residual = _rand(n, dtype=dtype), _rand(1, n, dtype=dtype)
    _close(gemv.gemv(x, w), x @ w.T, dtype)
    _close(gemv.gemv(x, w, bias=bias), F.linear(x, w, bias), dtype)
    _close(gemv.gemv(x, w, residual=residual), residual + x @ w.T, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, _BF16])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_norm_prologue(dtype: torch.dtype, n: int, k: int) -> None:
    x, w = _rand(1, k, dtype=dtype, scale=3.0), _rand(n, k, dtype=dtype, scale=k**-0.5)
    norm_weight = _rand(k, dtype=dtype, scale=0.2) + 1
    want = _hf_norm(x, norm_weight, 1e-5) @ w.T
    _close(gemv.gemv(x, w, norm_weight=norm_weight, eps=1e-5), want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, _BF16])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_gated_silu_with_norm(dtype: torch.dtype, n: int, k: int) -> None:
    x, w = _rand(1, k, dtype=dtype), _rand(2 * n, k, dtype=dtype, scale=k**-0.5)
    norm_weight = _rand(k, dtype=dtype, scale=0.2) + 1
    gate_up = _hf_norm(x, norm_weight, 1e-6) @ w.T
    gate, up = gate_up.chunk(2, dim=-1)
    want = F.silu(gate) * up
    _close(gemv.gemv(x, w, norm_weight=norm_weight, eps=1e-6, gated=True), want, dtype)


def test_can_use_gemv_only_for_one_16bit_row() -> None:
    w = torch.zeros(8, 4, dtype=torch.bfloat16)
    assert not gemv.can_use_gemv(torch.zeros(1, 4, dtype=torch.bfloat16), w)  # not CUDA
    if IS_CUDA:
        w = w.cuda()
        assert gemv.can_use_gemv(torch.zeros(1, 4, dtype=torch.bfloat16, device="cuda"), w)
        assert not gemv.can_use_gemv(torch.zeros(2, 4, dtype=torch.bfloat16, device="cuda"), w)
        assert not gemv.can_use_gemv(torch.zeros(1, 4, device="cuda"), w.float())


@pytest.mark.gpu
@pytest.mark.skipif(not IS_CUDA, reason="needs CUDA")
def test_decoder_layer_gemv_path_matches_unfused() -> None:
    """One token through a Llama layer: the GEMV path against the torch/cuBLAS path, bf16."""
    from kvserve.models.blocks import Attention
    from kvserve.models.common import DecoderLayer
    from kvserve.models.config import ModelArchConfig
    from kvserve.models.fused_layers import GemvLayer
    from kvserve.models.layers.attention.metadata import AttentionMetadata, forward_context
    from kvserve.models.layers.attention.triton_backend import TritonBackend
    from kvserve.models.layers.rotary import RotaryEmbedding

    arch = ModelArchConfig(
        architecture="llama",
        vocab_size=256,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=1,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=10_000.0,
        max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    layer = DecoderLayer(arch, 0, Attention(arch, 0, TritonBackend(), qkv_bias=False, o_bias=False))
    layer = layer.to("cuda", torch.bfloat16)
    for p in layer.parameters():
        p.data.normal_(0, 0.05)
    layer.input_layernorm.weight.data += 1
    layer.post_attention_layernorm.weight.data += 1
    cache = torch.randn(2, 4, 16, 2, 64, device="cuda").to(torch.bfloat16)
    layer.self_attn.kv_cache = cache
    metadata = AttentionMetadata(
        block_size=16,
        num_decodes=1,
        slot_mapping=torch.tensor([20], device="cuda"),
        block_tables=torch.tensor([[3, 1]], device="cuda"),
        seq_lens=torch.tensor([21], device="cuda"),
        query_start_loc_cpu=[0, 1],
        seq_lens_cpu=[21],
        context_lens_cpu=[20],
    )
    cos, sin = RotaryEmbedding(64, 10_000.0).to("cuda")(torch.tensor([20], device="cuda"), torch.bfloat16)
    x = torch.randn(1, 512, device="cuda").to(torch.bfloat16)
    # The oracle: the same layer and cache in fp32 (the torch path; no GEMV for fp32).
    oracle = copy.deepcopy(layer).float()
    oracle.self_attn.kv_cache = cache.float()
    layer.bind_kernels(torch.bfloat16)
    oracle.bind_kernels(torch.float32)
    with torch.no_grad(), forward_context(metadata):
        assert isinstance(layer.fused, GemvLayer) and oracle.fused is None
        fast = layer.fused(x, cos, sin)
        enabled, fused_ops.ENABLED = fused_ops.ENABLED, False
        try:
            layer.bind_kernels(torch.bfloat16)
            assert layer.fused is None
            slow = layer(x, cos, sin)  # cuBLAS and the torch small ops, all in bf16
        finally:
            fused_ops.ENABLED = enabled
        want = oracle(x.float(), cos.float(), sin.float())

    def error(got: torch.Tensor) -> float:
        return ((got.float() - want).norm() / want.norm()).item()

    # bf16 rounding of each op's output: both paths sit near the fp32 answer, the GEMV one no farther.
    assert error(fast) < 1e-2 and error(slow) < 1e-2
    assert error(fast) <= 1.5 * error(slow) + 1e-3, (error(fast), error(slow))


@pytest.mark.gpu
@pytest.mark.skipif(not IS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("vocab", [128 * 1002, 128 * 384, 1000])
def test_greedy_argmax_equals_argmax_with_ties(vocab: int) -> None:
    from kvserve.engine.sampler import greedy_argmax

    # bf16-rounded logits over a small range: many exact ties, including at the maximum.
    logits = (torch.randn(8, vocab, device="cuda") * 2).round().float()
    logits[3, -5:] = logits[3].max() + 1  # tied maximum in the last chunk only
    logits[5] = 0.0  # every entry tied: index 0
    logits[6, 7] = float("-inf")
    assert torch.equal(greedy_argmax(logits), logits.argmax(-1))


@pytest.mark.parametrize("dtype", [torch.float32, _BF16])
# 600 rows: 150 programs of the interpreter's 4 rows, more than the 128 slots, so some merge their
# best into a slot another program already holds; K 160: a loop step and a ragged tail.
@pytest.mark.parametrize(("n", "k"), [(37, 96), (600, 160)])
def test_logits_argmax_is_the_head_and_its_argmax(dtype: torch.dtype, n: int, k: int) -> None:
    x, w = _rand(1, k, dtype=dtype), _rand(n, k, dtype=dtype, scale=k**-0.5)
    slots = gemv.empty_argmax_slots(x.device)
    for _ in range(2):  # the second call finds the slots emptied by the first
        logits, ids = gemv.logits_argmax(x, w, slots)
        _close(logits, F.linear(x, w).float(), torch.float32 if dtype == torch.float32 else dtype)
        assert logits.dtype == torch.float32 and ids.shape == (1,)
        assert torch.equal(ids, logits.argmax(-1))  # exact: the argmax of the logits it returns
        assert torch.equal(slots, gemv.empty_argmax_slots(x.device))


@pytest.mark.parametrize("case", ["tie_first_index", "all_negative", "signed_zero", "nan"])
def test_logits_argmax_ties_signs_and_nan_follow_torch(case: str) -> None:
    # Rows of w pick out x's entries, so the logits are exactly the chosen values.
    values = {
        "tie_first_index": [1.0, 3.0, -2.0, 3.0, 3.0, 0.5] * 50,  # max 3.0 first at row 1
        "all_negative": [-5.0, -0.25, -3.0, -0.25, -7.0] * 60,
        "signed_zero": [-0.0, -1.0, 0.0, -2.0] * 75,  # -0.0 ties +0.0: row 0
        "nan": [0.0, 2.0, 1.0, 9.0, 1.0] * 60,
    }[case]
    n = len(values)
    x = torch.tensor([values], device=DEVICE)  # [1, n]
    w = torch.eye(n, device=DEVICE)  # logits = x
    if case == "nan":  # inf * x[0] (= 0) makes rows 7 and 12 NaN: the first NaN wins
        w[7, 0] = w[12, 0] = float("inf")
    want = F.linear(x, w).argmax(-1)
    assert case != "nan" or want.item() == 7
    _logits, ids = gemv.logits_argmax(x, w, gemv.empty_argmax_slots(x.device))
    assert torch.equal(ids, want), (ids, want)
