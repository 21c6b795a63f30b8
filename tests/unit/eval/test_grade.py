"""Grading per answer kind, including tool calls graded on the parsed call."""

from __future__ import annotations

import json

import pytest

from kvserve.eval.cases import CaseFilter, load_cases, select
from kvserve.eval.eval_case import AnswerKind, EvalCase
from kvserve.eval.grade import CaseStatus, ModelOutput, ToolCall, grade

CASES = {c.id: c for c in select(load_cases(), CaseFilter(("core", "tools")))}


def _status(case_id: str, text: str, finish: str = "stop") -> CaseStatus:
    return grade(CASES[case_id], ModelOutput(text, finish_reason=finish)).status


@pytest.mark.parametrize(
    ("case_id", "text", "expected"),
    [
        ("core/arith-01", "Answer: 085", CaseStatus.PASSED),
        ("core/arith-01", "Answer: 84", CaseStatus.FAILED),
        ("core/choice-01", "Answer: (B) Mercury", CaseStatus.PASSED),
        ("core/reading-02", "Answer: **Ostra Island.**", CaseStatus.PASSED),
        ("core/reading-02", "Answer: Ostra", CaseStatus.PASSED),  # an alias
        ("core/strings-04", "Answer: apple, cherry, mango, pear", CaseStatus.PASSED),
        ("core/strings-04", "Answer: apple, mango, cherry, pear", CaseStatus.FAILED),  # order matters
        ("core/reading-04", "Answer: 1, 5", CaseStatus.PASSED),
        ("core/reading-04", "Answer: 5", CaseStatus.PASSED),  # every line named is right
        ("core/reading-04", "Answer: 1, 2", CaseStatus.FAILED),  # line 2 is wrong
        ("core/arith-01", "I am still working on it and the sum of 47", CaseStatus.FAILED),
        ("core/strings-01", "The reversed string is 'tenalp'.", CaseStatus.PASSED),
        ("core/strings-01", 'Answer: The string "planet" reversed is "tenalp"', CaseStatus.PASSED),
        ("core/strings-01", 'The answer to "Reverse planet" is: "planet".', CaseStatus.FAILED),
        ("core/strings-06", "The answer is: \nAnswer: \nThe answer is: ", CaseStatus.FAILED),
        ("core/strings-04", "Answer: The sorted words are apple, cherry, mango, pear.", CaseStatus.PASSED),
    ],
)
def test_answer_kinds(case_id: str, text: str, expected: CaseStatus) -> None:
    assert _status(case_id, text) is expected


def test_a_cut_off_answer_is_incomplete_not_failed() -> None:
    assert (
        _status("core/arith-01", "First add the tens: 40 + 30 = 70, then", "length") is CaseStatus.INCOMPLETE
    )
    assert _status("core/arith-01", "Answer: 85 because", "length") is CaseStatus.PASSED


def _call(name: str, arguments: dict[str, object] | str) -> ModelOutput:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ModelOutput("", tool_calls=(ToolCall(name, text),), finish_reason="tool_calls")


@pytest.mark.parametrize(
    ("output", "expected", "detail"),
    [
        (_call("get_weather", {"city": "lisbon ", "unit": "Celsius"}), CaseStatus.PASSED, ""),
        (_call("get_weather", {"city": "Porto", "unit": "celsius"}), CaseStatus.FAILED, "argument city"),
        (_call("get_time", {"timezone": "Europe/Lisbon"}), CaseStatus.FAILED, "called get_time"),
        (_call("get_weather", '{"city": "Lisbon",'), CaseStatus.FAILED, "not JSON"),
        (_call("get_weather", {"city": "Lisbon", "unit": "celsius", "x": 1}), CaseStatus.FAILED, "unknown"),
        (ModelOutput("It is sunny."), CaseStatus.FAILED, "no tool call"),
    ],
)
def test_tool_calls_are_graded_on_the_parsed_call(
    output: ModelOutput, expected: CaseStatus, detail: str
) -> None:
    g = grade(CASES["tools/weather"], output)
    assert g.status is expected and detail in g.detail


def test_a_call_cut_off_by_max_tokens_is_incomplete() -> None:
    cut = ModelOutput("", tool_calls=(ToolCall("get_weather", '{"city": "Lisbo'),), finish_reason="length")
    assert grade(CASES["tools/weather"], cut).status is CaseStatus.INCOMPLETE


def test_numbers_in_tool_arguments_compare_by_value() -> None:
    case = CASES["tools/add"]
    assert grade(case, _call("add", {"a": 17.0, "b": "25"})).status is CaseStatus.PASSED
    assert grade(case, _call("add", {"a": 17, "b": 26})).status is CaseStatus.FAILED


def test_one_right_call_among_several_passes() -> None:
    wrong = ToolCall("get_weather", json.dumps({"city": "Paris"}))
    right = ToolCall("get_time", json.dumps({"timezone": "Asia/Tokyo"}))
    case: EvalCase = CASES["tools/pick-time"]
    assert case.kind is AnswerKind.TOOL_CALL
    assert grade(case, ModelOutput("", tool_calls=(wrong, right))).status is CaseStatus.PASSED


# SmolLM2's replies from the baseline trace that the extractors first read wrong (docs/evals.md).
AREA = (
    "A rectangle is 5 cm long and 3 cm wide. To find the area, you multiply the length by the width. "
    "So, the area is 5 cm * 3 cm = 15 square centimeters."
)
OPTIONS_COPIED = (
    "A. All lazzies are bloops\nB. All bloops are lazzies\nC. No bloops are lazzies\n"
    "D. Some razzies are not bloops"
)
PASSAGE_COPIED = "\n".join(
    line for line in CASES["core/reading-03"].prompt.splitlines() if line[:1].isdigit()
)
HARBOR_LINES_QUOTED = "\n".join(
    line for line in CASES["core/reading-04"].prompt.splitlines() if line.startswith(("1.", "5."))
)
PASSAGE_AND_FORMAT_COPIED = (
    "\n".join(line for line in CASES["core/reading-10"].prompt.splitlines() if line[:1].isdigit())
    + "\n\nFinish with a line of the form `Answer: <answer>`."
)


@pytest.mark.parametrize(
    ("case_id", "text", "expected", "extracted"),
    [
        # 15 is option B, named by its text only; "A rectangle" is not option A (it was read as A).
        ("core/choice-14", AREA, CaseStatus.PASSED, "B"),
        ("core/reading-06", "The ferry to Ostra Island runs twice a day in summer.", CaseStatus.PASSED, "2"),
        ("core/choice-05", OPTIONS_COPIED, CaseStatus.FAILED, ""),  # was D, the copy's last line
        ("core/choice-13", "D. Wednesday", CaseStatus.FAILED, "D"),  # one copied option line is a choice
        ("core/reading-03", PASSAGE_COPIED, CaseStatus.FAILED, ""),  # was line 8, the copy's last number
        ("core/reading-04", HARBOR_LINES_QUOTED, CaseStatus.PASSED, "5"),  # quoting lines is no echo
        ("core/reading-10", PASSAGE_AND_FORMAT_COPIED, CaseStatus.FAILED, ""),  # was '<answer>'
        ("core/units-01", "3.5 is equal to 3.5 * 60 = 21.5 minutes.", CaseStatus.FAILED, ""),  # was 60
    ],
)
def test_real_replies_first_misread(case_id: str, text: str, expected: CaseStatus, extracted: str) -> None:
    g = grade(CASES[case_id], ModelOutput(text))
    assert (g.status, g.extracted) == (expected, extracted)
