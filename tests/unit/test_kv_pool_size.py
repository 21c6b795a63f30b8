"""The CPU pool's auto size: 4 GiB at most, and at most a quarter of the machine's (or cgroup's) memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvserve.engine import kv_pool

GIB = 2**30


@pytest.mark.parametrize(
    ("memory", "cap"),
    [(None, 4 * GIB), (64 * GIB, 4 * GIB), (16 * GIB, 4 * GIB), (8 * GIB, 2 * GIB), (2 * GIB, GIB // 2)],
)
def test_auto_cap(memory: int | None, cap: int) -> None:
    assert kv_pool.auto_kv_cap_bytes(memory) == cap


def test_a_cgroup_limit_below_the_machine_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    limit = tmp_path / "memory.max"
    monkeypatch.setattr(kv_pool, "_CGROUP_MEMORY_MAX", limit)
    limit.write_text("max\n")
    physical = kv_pool.memory_limit_bytes()
    assert physical is not None and physical > GIB // 2
    limit.write_text(f"{GIB // 2}\n")
    assert kv_pool.memory_limit_bytes() == GIB // 2
    monkeypatch.setattr(kv_pool, "_CGROUP_MEMORY_MAX", tmp_path / "missing")
    assert kv_pool.memory_limit_bytes() == physical
