"""The built-in suites load, validate, filter, and their computable answers are right."""

from __future__ import annotations

import json
import math

import pytest

from kvserve.eval.cases import CaseFilter, load_cases, parse_jsonl, select, validate
from kvserve.eval.eval_case import AnswerKind, EvalCase
from kvserve.eval.prompts import messages_for

CASES = load_cases()
BY_ID = {c.id: c for c in CASES}


def test_the_suites_have_what_the_issue_asks() -> None:
    assert not validate(CASES)
    assert len(select(CASES, CaseFilter(("humaneval",)))) == 164
    core = select(CASES, CaseFilter(("core",)))
    assert len(core) >= 50 and {"arithmetic", "units", "reading", "strings"} <= {c.domain for c in core}
    choices = [c for c in core if c.kind is AnswerKind.CHOICE]
    assert min(len(c.choices) for c in choices) == 4 and max(len(c.choices) for c in choices) == 10
    assert len(select(CASES, CaseFilter(("tools",)))) >= 8
    smoke = select(CASES, CaseFilter(("smoke",)))
    assert 4 <= len(smoke) <= 8 and {c.kind for c in smoke} >= {AnswerKind.CODE, AnswerKind.TOOL_CALL}


# Each computable core answer, recomputed here independently of the data file.
COMPUTED = {
    "core/arith-01": 47 + 38,
    "core/arith-02": 123 * 7,
    "core/arith-03": 1000 - 357,
    "core/arith-04": 144 // 12,
    "core/arith-05": 240 * 15 // 100,
    "core/arith-06": 2**10,
    "core/arith-07": 12 * 15,
    "core/arith-08": 20 * 21 // 2,
    "core/arith-09": 68 - 6,
    "core/arith-10": 100 % 7,
    "core/arith-11": 150,
    "core/arith-12": math.gcd(84, 126),
    "core/arith-13": 81 - 16,
    "core/arith-14": 36 - 7,
    "core/units-01": 210,
    "core/units-02": 420,
    "core/units-03": 7200,
    "core/units-04": 212,
    "core/units-05": 3750,
    "core/units-06": 125,
    "core/units-07": 21 * 24,
    "core/units-08": round((-40 - 32) * 5 / 9),
    "core/units-09": 2500,
    "core/units-10": 4096,
    "core/reading-08": 17,
    "core/reading-09": 14,
    "core/strings-01": "tenalp",
    "core/strings-02": 4,
    "core/strings-05": len("transformer"),
    "core/strings-09": 7,
    "core/strings-10": "bonono",
    "core/strings-11": "3, 7, 19, 28, 42",
    "core/strings-04": "apple, cherry, mango, pear",
    "core/strings-08": "e, u, a, i, o",
}


@pytest.mark.parametrize("case_id", sorted(COMPUTED))
def test_computed_answers(case_id: str) -> None:
    assert BY_ID[case_id].answer == str(COMPUTED[case_id])


def test_choice_answers_are_the_right_option() -> None:
    def option(case_id: str) -> str:
        case = BY_ID[case_id]
        return case.choices["ABCDEFGHIJ".index(case.answer)]

    assert option("core/choice-02") == "29"
    assert [c for c in BY_ID["core/choice-07"].choices if int(c) % 6 == 0 and int(c) % 8 == 0] == [
        option("core/choice-07")
    ]
    powers = BY_ID["core/choice-10"].choices
    assert option("core/choice-10") == max(powers, key=lambda p: int(p.split("^")[0]) ** int(p.split("^")[1]))
    assert option("core/choice-11") == str(len([1, [2, 3], 4]))
    assert option("core/choice-13") == "Monday"


def test_filters() -> None:
    chosen = select(CASES, CaseFilter(("core", "tools"), domains=("units", "files")))
    assert {c.domain for c in chosen} == {"units", "files"}
    assert [c.id for c in select(CASES, CaseFilter(("humaneval",), case_ids=("HumanEval/7",)))] == [
        "HumanEval/7"
    ]
    assert all(
        c.source == "kvserve-tools" for c in select(CASES, CaseFilter(SUITES_ALL, sources=("kvserve-tools",)))
    )


SUITES_ALL = ("core", "humaneval", "tools", "smoke")


def test_limit_takes_the_first_cases_of_each_suite() -> None:
    chosen = [c.id for c in select(CASES, CaseFilter(("core", "humaneval"), limit=3))]
    first_core = [c.id for c in CASES if "core" in c.suites][:3]
    assert chosen == [*first_core, "HumanEval/0", "HumanEval/1", "HumanEval/2"]


def test_validation_names_each_problem() -> None:
    good = BY_ID["core/choice-01"].to_json()
    bad = [
        {**good, "answer": "F"},
        {**good, "id": "x", "suites": ["smoke"]},
        {**good, "id": "y", "kind": "integer", "answer": "ten", "choices": []},
        {**good, "id": "x"},
    ]
    cases = parse_jsonl("\n".join(json.dumps(b) for b in bad), "test")
    problems = "\n".join(validate(cases))
    assert "not one of the choice letters" in problems
    assert "smoke is a subset" in problems
    assert "is not an integer" in problems
    assert "duplicate id" in problems


def test_a_case_round_trips_through_json() -> None:
    for case in (BY_ID["core/choice-01"], BY_ID["tools/weather"], BY_ID["HumanEval/0"]):
        assert EvalCase.from_json(json.loads(json.dumps(case.to_json()))) == case


def test_prompts_state_the_answer_format() -> None:
    user = messages_for(BY_ID["core/choice-01"])[-1]["content"]
    assert "Choices:\nA. Venus\nB. Mercury" in user and "Answer: <letter>" in user
    assert "```python" in messages_for(BY_ID["HumanEval/0"])[-1]["content"]
