"""--tensor-parallel-size from the command line to EngineConfig, validated by resolve()."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from kvserve.cli.engine_args import add_engine_args, engine_config_from_args
from kvserve.config import EngineConfig, resolve


def _parse(*argv: str) -> EngineConfig:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    return engine_config_from_args(parser.parse_args(list(argv)))


def test_the_flag_reaches_the_config_and_defaults_to_one() -> None:
    assert _parse().tensor_parallel_size == 1
    assert _parse("--tensor-parallel-size", "4", "--device", "cuda").tensor_parallel_size == 4


def test_resolve_rejects_sizes_below_one_and_low_bit_weights() -> None:
    config = EngineConfig(device="cpu", dtype="bfloat16")
    with pytest.raises(ValueError, match="tensor-parallel-size"):
        resolve(dataclasses.replace(config, tensor_parallel_size=0))
    with pytest.raises(ValueError, match="weight-quant"):
        resolve(dataclasses.replace(config, tensor_parallel_size=2, weight_quant="int8"))
    assert resolve(dataclasses.replace(config, tensor_parallel_size=2)).tensor_parallel_size == 2


def test_forcing_int4_on_a_file_of_more_bits_warns(caplog: pytest.LogCaptureFixture) -> None:
    """Gemma 3's Q4_K_M (5-8-bit layers among the 4-bit ones) loses 10% perplexity under forced
    int4 decode (docs/numerics.md): the flag still wins, with a warning; a Q4 file gets none."""
    from kvserve.config import resolve_weight_quant

    forced = resolve(EngineConfig(device="cpu", dtype="float32", weight_quant="int4"))
    with caplog.at_level("WARNING", logger="kvserve.config"):
        assert resolve_weight_quant(forced, "int4").weight_quant == "int4"
        assert not caplog.records
        assert resolve_weight_quant(forced, "int8").weight_quant == "int4"
    assert "re-rounds this model file's 5-8-bit layers" in caplog.text


def test_weight_quant_auto_follows_the_model_file_on_cpu_only() -> None:
    """The CLI's default: a quantized GGUF's own precision on CPU; none on CUDA, in fp16 and under
    tensor parallelism, where the low-bit copies do not serve."""
    from kvserve.config import resolve_weight_quant

    assert _parse().weight_quant == "auto"
    cpu = resolve(EngineConfig(device="cpu", dtype="float32", weight_quant="auto"))
    assert cpu.weight_quant == "auto"  # decided once the model is loaded
    assert resolve_weight_quant(cpu, "int4").weight_quant == "int4"
    assert resolve_weight_quant(cpu, "int8").weight_quant == "int8"
    assert resolve_weight_quant(cpu, None).weight_quant == "none"
    explicit = dataclasses.replace(cpu, weight_quant="int8")
    assert resolve_weight_quant(explicit, "int4").weight_quant == "int8"  # a flag wins
    for other in (
        EngineConfig(device="cuda", dtype="bfloat16", weight_quant="auto"),
        EngineConfig(device="cpu", dtype="float16", weight_quant="auto"),
        EngineConfig(device="cpu", dtype="bfloat16", weight_quant="auto", tensor_parallel_size=2),
    ):
        assert resolve(other).weight_quant == "none"


def test_int8_prefill_with_weight_quant_auto_needs_an_int4_file() -> None:
    from kvserve.config import resolve_weight_quant

    config = resolve(EngineConfig(device="cpu", dtype="float32", weight_quant="auto", int8_prefill=True))
    assert resolve_weight_quant(config, "int4").weight_quant == "int4"
    with pytest.raises(ValueError, match="--int8-prefill needs --weight-quant int4"):
        resolve_weight_quant(config, "int8")
