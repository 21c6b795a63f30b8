"""kvserve/env.py: each KVSERVE_* switch parsed with its type and default; a bad value names its variable."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kvserve.cli.main import main
from kvserve.env import EnvSwitchError, EnvSwitches, read_switches, switches

DEFAULTS = EnvSwitches(
    is_fused_ops_enabled=True,
    is_cpu_kernels_enabled=True,
    is_cpu_prefill_attention_enabled=True,
    is_pdl_enabled=True,
    is_gemv_head_enabled=True,
    gemv_full_k_max_mb=16.0,
    switch_interval_ms=0.0,
    kv_write_delay_ms=0.0,
    is_dense_pack_enabled=True,
)
FLAGS = {
    "KVSERVE_FUSED_OPS": "is_fused_ops_enabled",
    "KVSERVE_CPU_KERNELS": "is_cpu_kernels_enabled",
    "KVSERVE_CPU_PREFILL_ATTENTION": "is_cpu_prefill_attention_enabled",
    "KVSERVE_PDL": "is_pdl_enabled",
    "KVSERVE_GEMV_HEAD": "is_gemv_head_enabled",
    "KVSERVE_DENSE_PACK": "is_dense_pack_enabled",
}
AMOUNTS = {
    "KVSERVE_GEMV_FULL_K_MB": "gemv_full_k_max_mb",
    "KVSERVE_SWITCH_INTERVAL_MS": "switch_interval_ms",
    "KVSERVE_KV_WRITE_DELAY_MS": "kv_write_delay_ms",
}


def test_unset_or_empty_gives_the_defaults() -> None:
    assert read_switches({}) == DEFAULTS
    assert read_switches(dict.fromkeys([*FLAGS, *AMOUNTS], "")) == DEFAULTS
    assert read_switches({"KVSERVE_UNRELATED": "banana"}) == DEFAULTS


@pytest.mark.parametrize("name", FLAGS)
@pytest.mark.parametrize(
    ("value", "expected"),
    [("0", False), ("1", True), ("false", False), ("True", True), (" off ", False), ("yes", True)],
)
def test_flags(name: str, value: str, expected: bool) -> None:
    assert getattr(read_switches({name: value}), FLAGS[name]) is expected


@pytest.mark.parametrize("name", AMOUNTS)
@pytest.mark.parametrize(("value", "expected"), [("0", 0.0), ("4", 4.0), ("0.5", 0.5), ("1e1", 10.0)])
def test_amounts(name: str, value: str, expected: float) -> None:
    assert getattr(read_switches({name: value}), AMOUNTS[name]) == expected


@pytest.mark.parametrize(
    ("name", "value"),
    [
        *((name, "banana") for name in FLAGS),
        ("KVSERVE_PDL", "2"),
        *((name, "banana") for name in AMOUNTS),
        ("KVSERVE_GEMV_FULL_K_MB", "-1"),
        ("KVSERVE_SWITCH_INTERVAL_MS", "nan"),
        ("KVSERVE_SWITCH_INTERVAL_MS", "inf"),
    ],
)
def test_a_bad_value_raises_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(EnvSwitchError, match=f"^{name}="):
        read_switches({name: value})


def test_the_cli_stops_on_a_bad_value(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("KVSERVE_PDL", "banana")
    switches.cache_clear()
    try:
        with pytest.raises(SystemExit, match=r"^kvserve: KVSERVE_PDL='banana': expected 1 or 0"):
            main(["models"])
    finally:
        monkeypatch.delenv("KVSERVE_PDL")
        switches.cache_clear()
    assert "installed" not in capsys.readouterr().out  # stopped before the command ran


def test_the_module_imports_nothing_from_the_project() -> None:
    """Every layer reads its switch from it, models and engine included."""
    path = Path(__file__).resolve().parents[2] / "kvserve" / "env.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0 and not (node.module or "").startswith("kvserve")
        elif isinstance(node, ast.Import):
            assert not any(alias.name.startswith("kvserve") for alias in node.names)
