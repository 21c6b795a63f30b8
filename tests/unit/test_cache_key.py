"""The cache key: its exact format, and every setting that changes the KV's bytes changes it."""

from __future__ import annotations

import itertools

import pytest

from kvserve.config import CacheConfig, EngineConfig
from kvserve.engine.cache_key import cache_key


def _config(
    dtype: str = "float32",
    weight_quant: str = "none",
    kv_dtype: str = "float32",
    int8_prefill: bool = False,
    bf16_prefill: bool = False,
) -> EngineConfig:
    """A resolved config (cache_key reads the resolved names, never "auto")."""
    return EngineConfig(
        dtype=dtype,  # type: ignore[arg-type]
        device="cpu",
        weight_quant=weight_quant,  # type: ignore[arg-type]
        int8_prefill=int8_prefill,
        bf16_prefill=bf16_prefill,
        cache=CacheConfig(kv_dtype=kv_dtype),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (_config(), "fp:float32:none:blocked-attn"),
        (_config(kv_dtype="float16"), "fp:float32:none:kv-float16:blocked-attn"),
        (_config(dtype="bfloat16", kv_dtype="bfloat16"), "fp:bfloat16:none:blocked-attn"),
        (_config(dtype="bfloat16", kv_dtype="float32"), "fp:bfloat16:none:kv-float32:blocked-attn"),
        (_config(weight_quant="int8"), "fp:float32:int8:blocked-attn"),
        (_config(weight_quant="int4", kv_dtype="float16"), "fp:float32:int4:kv-float16:blocked-attn"),
        (_config(weight_quant="int4", int8_prefill=True), "fp:float32:int4:int8-prefill:blocked-attn"),
        (
            _config(weight_quant="int4", int8_prefill=True, kv_dtype="float16"),
            "fp:float32:int4:int8-prefill:kv-float16:blocked-attn",
        ),
        (
            _config(weight_quant="int4", bf16_prefill=True),
            "fp:float32:int4:bf16-prefill-attn-mlp:blocked-attn",
        ),
        (
            _config(weight_quant="int8", bf16_prefill=True, kv_dtype="float16"),
            "fp:float32:int8:bf16-prefill-attn-mlp:kv-float16:blocked-attn",
        ),
        # resolve() never lets both through; were both set, the int8 GEMM is the one that runs.
        (
            _config(weight_quant="int4", int8_prefill=True, bf16_prefill=True),
            "fp:float32:int4:int8-prefill:blocked-attn",
        ),
    ],
)
def test_the_key_names_weights_dtype_quant_prefill_and_kv_dtype(config: EngineConfig, expected: str) -> None:
    assert cache_key(config, "fp") == expected


def test_every_setting_that_changes_the_kv_changes_the_key() -> None:
    combos = list(
        itertools.product(
            ("float32", "bfloat16"),  # dtype
            ("none", "int8", "int4"),  # weight_quant
            ("float32", "float16", "bfloat16"),  # kv_dtype
            ((False, False), (True, False), (False, True)),  # (int8_prefill, bf16_prefill)
        )
    )
    keys = {
        cache_key(_config(dtype, quant, kv_dtype, int8, bf16), "fp")
        for dtype, quant, kv_dtype, (int8, bf16) in combos
    }
    assert len(keys) == len(combos)
    assert cache_key(_config(), "fp") != cache_key(_config(), "other-weights")


def test_only_cpu_keys_name_the_blocked_prompt_attention() -> None:
    """The CPU's prompt KV comes from csrc/prefill_attention.cpp; CUDA's from the Triton kernels."""
    cuda = EngineConfig(dtype="bfloat16", device="cuda", cache=CacheConfig(kv_dtype="bfloat16"))
    assert cache_key(cuda, "fp") == "fp:bfloat16:none"
