"""`CaseResult`: how one case ended, as shown in the report and stored in the trace."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from kvserve.eval.eval_case import EvalCase
from kvserve.eval.grade import CaseStatus, Grade, ModelOutput, ToolCall


@dataclass(frozen=True)
class CaseResult:
    case: EvalCase
    status: CaseStatus
    extracted: str = ""
    detail: str = ""
    output: ModelOutput | None = None
    max_tokens: int = 0
    attempts: int = 0
    elapsed_s: float = 0.0
    usage: dict[str, Any] = field(default_factory=dict, hash=False)  # wire usage object, as sent

    def with_grade(self, grade: Grade) -> CaseResult:
        return replace(self, status=grade.status, extracted=grade.extracted, detail=grade.detail)

    def to_json(self) -> dict[str, Any]:
        output = self.output
        return {
            "type": "case",
            "id": self.case.id,
            "status": self.status.value,
            "extracted": self.extracted,
            "detail": self.detail,
            "output": output.content if output else None,
            "reasoning": output.reasoning if output else None,
            "tool_calls": [c._asdict() for c in output.tool_calls] if output else [],
            "finish_reason": output.finish_reason if output else None,
            "max_tokens": self.max_tokens,
            "attempts": self.attempts,
            "elapsed_s": round(self.elapsed_s, 3),
            "usage": self.usage,
            "case": self.case.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaseResult:
        output = None
        if data.get("output") is not None:
            calls = tuple(ToolCall(c["name"], c["arguments"]) for c in data.get("tool_calls") or ())
            output = ModelOutput(data["output"], data.get("reasoning") or "", calls, data["finish_reason"])
        return cls(
            case=EvalCase.from_json(data["case"]),
            status=CaseStatus(data["status"]),
            extracted=data.get("extracted", ""),
            detail=data.get("detail", ""),
            output=output,
            max_tokens=int(data.get("max_tokens", 0)),
            attempts=int(data.get("attempts", 0)),
            elapsed_s=float(data.get("elapsed_s", 0.0)),
            usage=data.get("usage") or {},
        )
