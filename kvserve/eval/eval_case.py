"""The eval case: one question, how its answer is graded, and which suites it belongs to."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class AnswerKind(enum.Enum):
    CHOICE = "choice"  # one letter A.. of `choices`
    INTEGER = "integer"
    STRING = "string"  # exact after normalization (case, spaces, markdown, trailing period)
    SEQUENCE = "sequence"  # ordered items, e.g. "b, c, a"
    LINE_SET = "line_set"  # line numbers: "9", "9,15", "20-22"
    CODE = "code"  # a Python function run against `tests` in the sandbox
    TOOL_CALL = "tool_call"  # a call of one of `tools`; `answer` is {"name":..., "arguments":{...}} JSON


@dataclass(frozen=True)
class EvalCase:
    id: str
    source: str
    license: str
    domain: str
    prompt: str
    kind: AnswerKind
    answer: str
    suites: tuple[str, ...]
    max_tokens: int
    choices: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    tests: str = ""  # CODE: Python that raises on a wrong answer, run after the model's code
    entry_point: str = ""  # CODE: the function the model must write
    tools: tuple[dict[str, Any], ...] = field(default=(), hash=False)  # TOOL_CALL: OpenAI tool objects

    @property
    def suite(self) -> str:
        """The suite the case is reported under first (its own data set, not a subset like smoke)."""
        return self.suites[0]

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "source": self.source,
            "license": self.license,
            "domain": self.domain,
            "prompt": self.prompt,
            "kind": self.kind.value,
            "answer": self.answer,
            "suites": list(self.suites),
            "max_tokens": self.max_tokens,
        }
        for name in ("choices", "aliases", "tools"):
            if getattr(self, name):
                data[name] = list(getattr(self, name))
        for name in ("tests", "entry_point"):
            if getattr(self, name):
                data[name] = getattr(self, name)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EvalCase:
        """Raises CaseError naming the case on a missing or mistyped field."""
        case_id = data.get("id", "?")
        try:
            return cls(
                id=str(data["id"]),
                source=str(data["source"]),
                license=str(data["license"]),
                domain=str(data["domain"]),
                prompt=str(data["prompt"]),
                kind=AnswerKind(data["kind"]),
                answer=str(data["answer"]),
                suites=tuple(data["suites"]),
                max_tokens=int(data["max_tokens"]),
                choices=tuple(data.get("choices", ())),
                aliases=tuple(data.get("aliases", ())),
                tests=str(data.get("tests", "")),
                entry_point=str(data.get("entry_point", "")),
                tools=tuple(data.get("tools", ())),
            )
        except (KeyError, ValueError, TypeError) as error:
            raise CaseError(f"case {case_id}: bad or missing field: {error}") from error


class CaseError(ValueError):
    """A case file or case that cannot be used."""
