"""Grading: one model output against one case -> PASSED, FAILED or INCOMPLETE, with what was extracted."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any, NamedTuple

from kvserve.eval import extract
from kvserve.eval.eval_case import AnswerKind, EvalCase
from kvserve.eval.prompts import user_text
from kvserve.eval.sandbox import DEFAULT_LIMITS, SandboxLimits, run_python


class CaseStatus(enum.Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    PASSED = "PASSED"
    FAILED = "FAILED"
    INCOMPLETE = "INCOMPLETE"  # no answer before the output ran out of tokens
    ERROR = "ERROR"  # the request failed (HTTP or transport)
    STOPPED = "STOPPED"  # the run was quit before the case finished

    @property
    def is_graded(self) -> bool:
        return self in (CaseStatus.PASSED, CaseStatus.FAILED)

    @property
    def is_done(self) -> bool:
        return self not in (CaseStatus.PENDING, CaseStatus.RUNNING)


class ToolCall(NamedTuple):
    name: str
    arguments: str  # JSON text as the server sent it


@dataclass(frozen=True)
class ModelOutput:
    content: str
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"

    @property
    def is_truncated(self) -> bool:
        return self.finish_reason == "length"


@dataclass(frozen=True)
class Grade:
    status: CaseStatus
    extracted: str  # what the extractor found, "" when nothing
    detail: str = ""


def grade(case: EvalCase, output: ModelOutput, limits: SandboxLimits = DEFAULT_LIMITS) -> Grade:
    if case.kind is AnswerKind.CODE:
        return _grade_code(case, output, limits)
    if case.kind is AnswerKind.TOOL_CALL:
        return _grade_tool_call(case, output)
    content = extract.without_echo(output.content, user_text(case))
    if output.is_truncated and not extract.has_answer(content):
        # A cut-off text's last number or letter is whatever it was saying, not an answer.
        return Grade(CaseStatus.INCOMPLETE, "", "ran out of tokens before an answer")
    readings = _extract(case, content)
    if not readings:
        return Grade(CaseStatus.FAILED, "", "no answer found")
    for found in readings:
        if any(_matches(case.kind, found, expected) for expected in (case.answer, *case.aliases)):
            return Grade(CaseStatus.PASSED, _show(found))
    return Grade(CaseStatus.FAILED, _show(readings[0]))


def _extract(case: EvalCase, text: str) -> list[object]:
    """The extracted answer in the kind's comparable form, best reading first; empty when none.
    Strings and sequences have several readings ("The reversed string is 'tenalp'")."""
    kind = case.kind
    if kind is AnswerKind.STRING:
        return list(extract.string_candidates(text))
    if kind is AnswerKind.SEQUENCE:
        return list(extract.sequence_candidates(text))
    found: object | None
    if kind is AnswerKind.CHOICE:
        found = extract.find_letter(text, len(case.choices), case.choices)
    elif kind is AnswerKind.INTEGER:
        found = extract.find_integer(text)
    else:
        assert kind is AnswerKind.LINE_SET, kind
        found = extract.find_line_set(text) or None
    return [] if found is None else [found]


def _matches(kind: AnswerKind, found: object, expected: str) -> bool:
    if kind is AnswerKind.INTEGER:
        return found == extract.parse_integer(expected)
    if kind is AnswerKind.STRING:
        return found == extract.normalize(expected)
    if kind is AnswerKind.SEQUENCE:
        return found == extract.split_sequence(expected)
    if kind is AnswerKind.LINE_SET:
        # As the reference grades line localization: every line named is right, and one is named.
        assert isinstance(found, frozenset)
        return bool(found) and found <= extract.parse_line_set(expected)
    return found == expected


def _show(found: object) -> str:
    if isinstance(found, frozenset):
        return ",".join(str(n) for n in sorted(found))
    if isinstance(found, tuple):
        return ", ".join(found)
    return str(found)


def code_program(case: EvalCase, code: str) -> str:
    """The case's prompt (imports, helpers, the signature), then the model's code (a whole function,
    which redefines it, or just the body, which continues it), then the tests."""
    prompt = case.prompt if case.prompt.endswith("\n") else case.prompt + "\n"
    return f"{prompt}{code}\n\n{case.tests}"


def _grade_code(case: EvalCase, output: ModelOutput, limits: SandboxLimits) -> Grade:
    code = extract.find_code(output.content, case.entry_point)
    if not code.strip():
        status = CaseStatus.INCOMPLETE if output.is_truncated else CaseStatus.FAILED
        return Grade(status, "", "no code found")
    if output.is_truncated and not _compiles(code_program(case, code)):
        return Grade(CaseStatus.INCOMPLETE, code, "ran out of tokens inside the code")
    result = run_python(code_program(case, code), limits)
    return Grade(CaseStatus.PASSED if result.is_passed else CaseStatus.FAILED, code, result.detail)


def _compiles(program: str) -> bool:
    try:
        compile(program, "<model>", "exec")
    except (SyntaxError, ValueError):
        return False
    return True


def _grade_tool_call(case: EvalCase, output: ModelOutput) -> Grade:
    if not output.tool_calls:
        status = CaseStatus.INCOMPLETE if output.is_truncated else CaseStatus.FAILED
        return Grade(status, "", "no tool call")
    expected = json.loads(case.answer)
    shown = "; ".join(f"{c.name}({c.arguments})" for c in output.tool_calls)
    for call in output.tool_calls:
        problem = _call_problem(case, call, expected)
        if problem is None:
            return Grade(CaseStatus.PASSED, shown)
    status = CaseStatus.INCOMPLETE if output.is_truncated else CaseStatus.FAILED  # cut off mid-call
    return Grade(status, shown, problem or "")


def _call_problem(case: EvalCase, call: ToolCall, expected: dict[str, Any]) -> str | None:
    """Why `call` is not the expected call, or None when it is."""
    if call.name != expected["name"]:
        return f"called {call.name}, expected {expected['name']}"
    try:
        arguments = json.loads(call.arguments or "{}")
    except json.JSONDecodeError:
        return "arguments are not JSON"
    if not isinstance(arguments, dict):
        return "arguments are not an object"
    known = _schema_properties(case, call.name)
    if unknown := sorted(set(arguments) - known):
        return f"unknown arguments {unknown}"
    for key, value in expected["arguments"].items():
        if key not in arguments or not _same_value(value, arguments[key]):
            return f"argument {key}={arguments.get(key)!r}, expected {value!r}"
    return None


def _schema_properties(case: EvalCase, name: str) -> set[str]:
    for tool in case.tools:
        function = tool.get("function", {})
        if function.get("name") == name:
            return set(function.get("parameters", {}).get("properties", {}))
    return set()


def _same_value(expected: Any, got: Any) -> bool:
    """Numbers compare by value ("5" and 5.0 are 5), strings by normalized text, lists item by item."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return expected == got
    if isinstance(expected, int | float):
        try:
            return float(got) == float(expected)
        except (TypeError, ValueError):
            return False
    if isinstance(expected, list):
        return (
            isinstance(got, list)
            and len(got) == len(expected)
            and all(_same_value(e, g) for e, g in zip(expected, got, strict=True))
        )
    if isinstance(expected, dict):
        return isinstance(got, dict) and all(k in got and _same_value(v, got[k]) for k, v in expected.items())
    return isinstance(got, str) and extract.normalize(got) == extract.normalize(str(expected))
