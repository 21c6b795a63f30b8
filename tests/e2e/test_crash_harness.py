"""The crash harness (scripts/crash_harness.py, issue 37) for two rounds per mode, the fewest that
restart on a killed server's directory and kill the restarted one: a real `kvserve serve` on the
default model killed with SIGKILL during checkpoint writes and evictions, restarted on the same
directory. The full runs (100 rounds each) and their figures are in docs/reliability.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.serve_process import REPO

pytestmark = [pytest.mark.model, pytest.mark.slow]


def _harness(tmp_path: Path, *args: str) -> dict[str, Any]:
    """Run the harness with `args`; its report, after checking it found no failure."""
    report_path = tmp_path / "report.json"
    command = [sys.executable, "scripts/crash_harness.py", *args]
    run = subprocess.run(
        [*command, "--work-dir", str(tmp_path / "work"), "--json", str(report_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=2300,
        check=False,
    )
    assert report_path.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["failures"] == [] and run.returncode == 0, report
    return report


@pytest.mark.timeout(2400)
def test_a_few_kill_9_rounds_lose_nothing_reported_saved_and_load_nothing_corrupt(tmp_path: Path) -> None:
    report = _harness(tmp_path, "--rounds", "2", "--seed", "5")
    assert report["rounds"] == 2


@pytest.mark.timeout(2400)
def test_kills_aimed_at_evictions_lose_nothing_reported_saved(tmp_path: Path) -> None:
    """--evictions for two rounds: a RAM pool of one context, so the second life's turns reuse each
    other's blocks and the disk tier writes `evict` checkpoints (and deletes older ones over its
    budget) while the kill is aimed at them."""
    report = _harness(tmp_path, "--evictions", "--rounds", "2", "--seed", "5")
    assert report["rounds"] == 2
    assert report["checkpoints_queued"].get("evict", 0) >= 1, report  # the pool did evict
