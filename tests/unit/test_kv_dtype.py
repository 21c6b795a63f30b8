"""`--kv-cache-dtype`: the KV's dtype in the pool and on disk (config.resolve fills auto)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvserve.config import CacheConfig, EngineConfig, resolve
from kvserve.models.layers.attention.kv_dtype import as_stored, to_kv_dtype


def _kv(dtype: str, device: str = "cpu", kv: str = "auto") -> str:
    config = EngineConfig(device=device, dtype=dtype, weight_quant="none", cache=CacheConfig(kv_dtype=kv))  # type: ignore[arg-type]
    return resolve(config).cache.kv_dtype


def test_auto_is_fp16_under_a_float32_cpu_engine_else_the_engine_dtype() -> None:
    assert _kv("float32") == "float16"  # llama.cpp's default KV type; half the bytes a decode reads
    assert _kv("bfloat16") == "bfloat16"
    assert _kv("float32", device="cuda") == "float32"  # the Triton kernels read the compute dtype
    assert _kv("bfloat16", device="cuda") == "bfloat16"


def test_explicit_choices_and_what_is_refused() -> None:
    assert _kv("float32", kv="float32") == "float32"
    assert _kv("float32", kv="float16") == "float16"
    assert _kv("bfloat16", kv="bfloat16") == "bfloat16"
    for dtype, device, kv in [
        ("bfloat16", "cpu", "float16"),
        ("bfloat16", "cpu", "float32"),
        ("float32", "cpu", "bfloat16"),
        ("float32", "cuda", "float16"),
    ]:
        with pytest.raises(ValueError, match="--kv-cache-dtype"):
            _kv(dtype, device, kv)
    with pytest.raises(ValueError, match="unknown --kv-cache-dtype"):
        _kv("float32", kv="int8")


def test_the_torch_dtypes() -> None:
    config = resolve(EngineConfig(device="cpu", dtype="float32", weight_quant="none"))
    assert (config.torch_dtype, config.torch_kv_dtype) == (torch.float32, torch.float16)
    with pytest.raises(AssertionError, match="resolve"):
        _ = dataclasses.replace(config, cache=CacheConfig()).torch_kv_dtype


def test_stored_kv_saturates_and_rounds_once() -> None:
    x = torch.tensor([1.0e5, -1.0e5, 0.1, 3.0])
    stored = to_kv_dtype(x, torch.float16)
    assert stored.dtype == torch.float16 and stored[:2].tolist() == [65504.0, -65504.0]
    assert bool(torch.isfinite(stored).all())
    torch.testing.assert_close(stored[2:].float(), x[2:], atol=1e-4, rtol=1e-3)
    assert to_kv_dtype(x, torch.float32) is x
    read = as_stored(x, torch.float16)
    assert read.dtype == torch.float32 and torch.equal(read, stored.float())
    assert torch.equal(as_stored(read, torch.float16), read)  # rounding twice changes nothing
    assert as_stored(x, torch.float32) is x
