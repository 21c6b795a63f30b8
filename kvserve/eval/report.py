"""The final report: pass counts per suite and per domain, as a text table and a JSON summary."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kvserve.eval.grade import CaseStatus
from kvserve.eval.result import CaseResult

_COLUMNS = (CaseStatus.PASSED, CaseStatus.FAILED, CaseStatus.INCOMPLETE, CaseStatus.ERROR, CaseStatus.STOPPED)


@dataclass(frozen=True)
class Tally:
    counts: dict[CaseStatus, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def num_passed(self) -> int:
        return self.counts.get(CaseStatus.PASSED, 0)

    @property
    def score(self) -> float:
        """Passed over every case selected: a case that did not finish counts as not passed."""
        return self.num_passed / self.total if self.total else 0.0

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"total": self.total, "passed": self.num_passed, "score": round(self.score, 4)}
        data.update({s.value.lower(): self.counts.get(s, 0) for s in (*_COLUMNS, CaseStatus.PENDING)})
        return data


def tally(results: Iterable[CaseResult]) -> Tally:
    return Tally(dict(Counter(r.status for r in results)))


@dataclass(frozen=True)
class Summary:
    overall: Tally
    suites: dict[str, Tally]
    domains: dict[str, Tally]


def summarize(results: Sequence[CaseResult], suites: Sequence[str]) -> Summary:
    """Per selected suite (a case counts in each selected suite it belongs to) and per domain."""
    by_suite = {s: tally(r for r in results if s in r.case.suites) for s in suites}
    domains = sorted({r.case.domain for r in results})
    by_domain = {d: tally(r for r in results if r.case.domain == d) for d in domains}
    return Summary(tally(results), {s: t for s, t in by_suite.items() if t.total}, by_domain)


def summary_json(summary: Summary, meta: dict[str, Any]) -> dict[str, Any]:
    return {
        **meta,
        "overall": summary.overall.to_json(),
        "suites": {name: t.to_json() for name, t in summary.suites.items()},
        "domains": {name: t.to_json() for name, t in summary.domains.items()},
    }


def render_report(summary: Summary) -> str:
    lines = [_header()]
    lines += [_row(f"suite {name}", t) for name, t in summary.suites.items()]
    lines.append("")
    lines += [_row(f"  {name}", t) for name, t in summary.domains.items()]
    lines += ["", _row("overall", summary.overall)]
    return "\n".join(lines)


def _header() -> str:
    names = "".join(f"{s.value.lower():>11}" for s in _COLUMNS)
    return f"{'':24}{'score':>14}{names}"


def _row(label: str, t: Tally) -> str:
    score = f"{t.num_passed}/{t.total} {100 * t.score:5.1f}%"
    counts = "".join(f"{t.counts.get(s, 0):>11}" for s in _COLUMNS)
    return f"{label:24}{score:>14}{counts}"
