"""The final report and JSON summary (per suite, per domain, overall), and what `kvserve eval
--regrade` prints and writes when a grade changed."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from kvserve.cli.main import main
from kvserve.eval.cases import CaseFilter, load_cases, select
from kvserve.eval.grade import CaseStatus, ModelOutput
from kvserve.eval.report import render_report, summarize, summary_json
from kvserve.eval.result import CaseResult
from kvserve.eval.trace import TraceWriter

BY_ID = {c.id: c for c in select(load_cases(), CaseFilter(("core", "tools", "humaneval")))}


def _result(case_id: str, status: CaseStatus, text: str = "", extracted: str = "") -> CaseResult:
    return CaseResult(BY_ID[case_id], status, extracted, output=ModelOutput(text))


RESULTS = [
    _result("core/arith-01", CaseStatus.PASSED, "Answer: 85", "85"),  # also in smoke
    _result("core/arith-02", CaseStatus.FAILED, "Answer: 1", "1"),
    _result("core/arith-03", CaseStatus.INCOMPLETE),
    _result("core/units-01", CaseStatus.PASSED, "Answer: 210", "210"),
    _result("HumanEval/0", CaseStatus.ERROR),
]


def test_summary_per_suite_and_per_domain() -> None:
    summary = summarize(RESULTS, ["core", "humaneval", "smoke"])
    data = summary_json(summary, {"model": "m"})
    assert data["model"] == "m"
    assert data["overall"] == {
        "total": 5, "passed": 2, "score": 0.4, "failed": 1, "incomplete": 1, "error": 1, "stopped": 0,
        "pending": 0,
    }  # fmt: skip
    core = data["suites"]["core"]
    # INCOMPLETE and ERROR count as not passed: the score is over every case selected.
    assert (core["total"], core["passed"], core["failed"], core["incomplete"]) == (4, 2, 1, 1)
    assert core["score"] == 0.5
    assert data["suites"]["humaneval"]["error"] == 1 and data["suites"]["humaneval"]["score"] == 0.0
    assert data["suites"]["smoke"]["total"] == 1  # a case counts in each selected suite it belongs to
    assert data["domains"]["arithmetic"] == {**data["domains"]["arithmetic"], "total": 3, "passed": 1}
    assert data["domains"]["units"]["score"] == 1.0 and data["domains"]["code"]["total"] == 1
    text = render_report(summary)
    assert "suite core" in text and "  arithmetic" in text and "1/3  33.3%" in text
    assert text.splitlines()[-1].startswith("overall") and "2/5  40.0%" in text


def test_a_suite_with_no_selected_case_is_left_out() -> None:
    assert list(summarize(RESULTS[:2], ["core", "tools"]).suites) == ["core"]


def _regrade_cli(*argv: str) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["--log-level", "WARNING", "eval", "--regrade", *argv])
    assert raised.value.code == 0


def test_regrade_cli_prints_what_changed_and_writes_the_new_summary_and_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, summary_path, again = tmp_path / "run.jsonl", tmp_path / "again.json", tmp_path / "again.jsonl"
    writer = TraceWriter(trace, {"suites": ["core"]})
    stale = _result("core/arith-01", CaseStatus.FAILED, "Answer: x = 40 + 45 = 85", "40")
    stopped = CaseResult(BY_ID["core/arith-02"], CaseStatus.STOPPED, output=ModelOutput("Answer: 861"))
    for result in (stale, stopped, RESULTS[3]):
        writer.write(result)
    writer.close({"model": "m", "wall_s": 1.0})
    packed = tmp_path / "run.jsonl.gz"  # committed baselines are gzipped; --regrade reads them as they are
    packed.write_bytes(gzip.compress(trace.read_bytes()))

    _regrade_cli(str(packed), "--json", str(summary_path), "--trace", str(again))
    out = capsys.readouterr().out
    assert "changed core/arith-01: FAILED -> PASSED ('40' -> '85')" in out
    assert "regraded 2 cases: changed=1 not_graded=1" in out  # the STOPPED case is not re-graded
    summary = json.loads(summary_path.read_text())
    assert summary["regraded_from"] == str(packed) and summary["model"] == "m"
    assert summary["suites"]["core"] == {**summary["suites"]["core"], "passed": 2, "stopped": 1}

    _regrade_cli(str(again))  # the re-graded trace holds today's grades: nothing changes again
    assert "regraded 2 cases: changed=0 not_graded=1" in capsys.readouterr().out
