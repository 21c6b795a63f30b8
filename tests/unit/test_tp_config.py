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
