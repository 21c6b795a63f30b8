"""The one-call C++ decode stack (models/decode_stack.py) against the per-layer low-bit path it
replaces: the same kernels in the same order, so logits must be equal bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvserve.models.layers import cpu_ext, lowbit_cpu
from kvserve.models.layers.quant import WeightOnlyLinear, apply_weight_quant
from kvserve.models.loader.safetensors import load_hf_model
from tests.models.helpers import PagedDriver, save_tiny_hf_model

pytestmark = pytest.mark.skipif(cpu_ext.load() is None, reason="no AVX2 CPU kernels here")


def _model(family: str, tmp_path: Path, scheme: str) -> torch.nn.Module:
    save_tiny_hf_model(family, tmp_path)
    model = load_hf_model(tmp_path, torch.float32).model
    apply_weight_quant(model, scheme)
    return model


def _run(model: torch.nn.Module, use_stack: bool) -> list[torch.Tensor]:
    """Prefill three sequences, then decode them alone and together; every step's logits."""
    model.model.use_fused_stack = use_stack  # False: the per-layer path
    driver = PagedDriver(model, seed=3)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 384, (n,), generator=gen).tolist() for n in (9, 17, 5)]
    logits = [driver.step([(i, p)]) for i, p in enumerate(prompts)]
    tokens = [int(row[-1].argmax()) for row in logits]
    for batch in ([0], [0, 1, 2], [2, 0], [1]):
        out = driver.step([(i, [tokens[i]]) for i in batch])
        logits.append(out)
        for row, i in enumerate(batch):
            tokens[i] = int(out[row].argmax())
    assert (model.model.fused_stack is not None) == use_stack
    return logits


@pytest.mark.parametrize("scheme", ["int4", "int8"])
# qwen2: q/k/v biases; qwen3: q/k norms; gemma3: four norms (1 + w), GELU-tanh, q/k norms, sliding and
# global layers with two RoPE tables (window 8: the decodes below cross it).
@pytest.mark.parametrize("family", ["llama", "llama_tied", "qwen2", "qwen3", "gemma3", "gemma3_hd256"])
def test_stack_equals_the_per_layer_path(family: str, scheme: str, tmp_path: Path) -> None:
    stacked = _run(_model(family, tmp_path / "a", scheme), use_stack=True)
    per_layer = _run(_model(family, tmp_path / "b", scheme), use_stack=False)
    for a, b in zip(stacked, per_layer, strict=True):
        assert torch.equal(a, b)


def test_no_stack_for_dense_models(tmp_path: Path) -> None:
    dense = load_hf_model(save_tiny_hf_model("llama", tmp_path / "a") and tmp_path / "a", torch.float32).model
    driver = PagedDriver(dense)
    driver.step([(0, [1, 2, 3])])
    driver.step([(0, [4])])
    assert dense.model.fused_stack is None


@pytest.mark.parametrize("family", ["gemma3", "qwen3"])
def test_lowbit_decode_is_the_dense_model_up_to_activation_rounding(family: str, tmp_path: Path) -> None:
    """The fused low-bit layer (norm placement, GELU-tanh, q/k norms) against the dense torch layer on
    the dequantized weights: only the activations' int8 rounding differs, so a norm in the wrong place
    or a wrong activation shows up as a large error."""
    quant = _model(family, tmp_path / "a", "int4")
    dense = load_hf_model(tmp_path / "a", torch.float32).model
    quantized = dict(quant.named_modules())
    for name, module in dense.named_modules():
        q = quantized[name]
        if isinstance(module, torch.nn.Linear) and isinstance(q, WeightOnlyLinear):  # not an untied head
            module.weight.data = lowbit_cpu.dequantize(q.qweight, q.scales, q.bits)
    quant.head_quant = None  # both heads dense (the head's own rounding is tested elsewhere)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 384, (11,), generator=gen).tolist()
    drivers = PagedDriver(quant, seed=1), PagedDriver(dense, seed=1)
    outs: list[list[torch.Tensor]] = [[], []]
    for out, driver in zip(outs, drivers, strict=True):
        token = int(driver.step([(0, prompt)])[-1].argmax())
        for _ in range(12):  # past the sliding window of 8
            logits = driver.step([(0, [token])])
            out.append(logits)
            token = int(logits[-1].argmax())
    assert quant.model.fused_stack is not None
    for a, b in zip(*outs, strict=True):
        assert (a - b).norm() / b.norm() < 0.05


def test_rebinding_the_caches_rebuilds_the_stack(tmp_path: Path) -> None:
    model = _model("llama", tmp_path, "int4")
    first = _run(model, use_stack=True)
    assert torch.equal(_run(model, use_stack=True)[-1], first[-1])  # a new driver binds new caches
