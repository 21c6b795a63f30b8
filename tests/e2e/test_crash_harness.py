"""The crash harness (scripts/crash_harness.py, issue 37) for two rounds, the fewest that restart on
a killed server's directory and kill the restarted one: a real `kvserve serve` on the default model
killed with SIGKILL during checkpoint writes and evictions, restarted on the same directory (a run
with seed 5 on the 2-core EPYC: a kill mid-request, one after a response, the second life's turn
loaded from disk and checked against the cold server; the kill points vary with timing). The full
run (100 rounds) and its figures are in docs/reliability.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.serve_process import REPO

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.mark.timeout(2400)
def test_a_few_kill_9_rounds_lose_nothing_reported_saved_and_load_nothing_corrupt(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    command = [sys.executable, "scripts/crash_harness.py", "--rounds", "2", "--seed", "5"]
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
    assert report["rounds"] == 2
