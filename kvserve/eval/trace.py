"""The trace: a JSONL file with a run header and one line per finished case (prompt, output,
extracted answer, status), written as cases finish; `regrade` re-grades one with today's graders."""

from __future__ import annotations

import gzip
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

from kvserve.eval.grade import CaseStatus, grade
from kvserve.eval.prompts import messages_for
from kvserve.eval.result import CaseResult
from kvserve.eval.sandbox import DEFAULT_LIMITS, SandboxLimits


class TraceWriter:
    def __init__(self, path: Path, header: dict[str, Any]):
        self._file: IO[str] = path.open("w", encoding="utf-8")
        self._write({"type": "run", **header})

    def write(self, result: CaseResult) -> None:
        self._write({**result.to_json(), "messages": messages_for(result.case)})

    def close(self, footer: dict[str, Any] | None = None) -> None:
        """Ends the trace; the footer holds what is known only at the end (model, wall time)."""
        if footer:
            self._write({"type": "end", **footer})
        self._file.close()

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()  # a killed run still leaves every finished case behind


def read_trace(path: Path) -> tuple[dict[str, Any], list[CaseResult]]:
    """The run header (with the end record's fields) and the last result of each case (a case run
    again in the TUI appears twice). A `.gz` trace is read as gzip (committed baselines are)."""
    header: dict[str, Any] = {}
    results: dict[str, CaseResult] = {}
    if path.suffix == ".gz":
        text = gzip.decompress(path.read_bytes()).decode("utf-8")
    else:
        text = path.read_text(encoding="utf-8")
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON: {error}") from error
        if record.get("type") in ("run", "end"):
            header |= {k: v for k, v in record.items() if k != "type"}
        elif record.get("type") == "case":
            results[record["id"]] = CaseResult.from_json(record)
    return header, list(results.values())


class GradeChange(NamedTuple):
    case_id: str
    before: CaseStatus
    after: CaseStatus
    extracted_before: str
    extracted_after: str


@dataclass(frozen=True)
class Regrade:
    results: list[CaseResult]
    changes: list[GradeChange]
    num_not_graded: int  # cases that did not finish (INCOMPLETE, ERROR, STOPPED): never re-graded


def regrade(results: list[CaseResult], limits: SandboxLimits = DEFAULT_LIMITS, workers: int = 4) -> Regrade:
    """Re-grades only PASSED/FAILED results: an interrupted case's partial output is not an answer."""
    gradable = [r for r in results if r.status.is_graded and r.output is not None]

    def again(result: CaseResult) -> CaseResult:
        assert result.output is not None
        return result.with_grade(grade(result.case, result.output, limits))

    with ThreadPoolExecutor(max_workers=workers) as pool:
        regraded = dict(zip((r.case.id for r in gradable), pool.map(again, gradable), strict=True))
    changes = [
        GradeChange(r.case.id, r.status, n.status, r.extracted, n.extracted)
        for r in gradable
        if (n := regraded[r.case.id]).status is not r.status or n.extracted != r.extracted
    ]
    new = [regraded.get(r.case.id, r) for r in results]
    return Regrade(new, changes, len(results) - len(gradable))
