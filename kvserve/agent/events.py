"""What a streaming model response is made of, whichever wire protocol carried it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvserve.agent.messages import Message, ToolCall, Usage


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of tool call `index`: the first piece carries its id and name."""

    index: int
    call_id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class UsageReport:
    usage: Usage


@dataclass(frozen=True)
class Finished:
    reason: str  # "stop" | "length" | "tool_calls" | "cancelled"


@dataclass(frozen=True)
class Waiting:
    """A keepalive while the server prefills (no tokens yet)."""


@dataclass(frozen=True)
class PrefillProgress:
    """kvserve's prefill counts (asked for with the `kvserve` extension's `prefill_progress`)."""

    num_prompt_tokens: int
    num_cached_tokens: int
    num_processed_tokens: int  # prompt tokens whose KV is ready, cached ones included
    elapsed_s: float

    @property
    def fraction(self) -> float:
        return min(1.0, self.num_processed_tokens / self.num_prompt_tokens) if self.num_prompt_tokens else 0.0

    @property
    def tokens_per_s(self) -> float | None:
        computed = self.num_processed_tokens - self.num_cached_tokens
        return computed / self.elapsed_s if self.elapsed_s > 0 and computed > 0 else None


StreamEvent = TextDelta | ReasoningDelta | ToolCallDelta | UsageReport | Finished | Waiting | PrefillProgress


@dataclass(frozen=True)
class ModelRequest:
    messages: tuple[Message, ...]
    tools: tuple[tuple[str, str, dict[str, Any]], ...]  # (name, description, JSON schema)
    max_tokens: int
    temperature: float | None = None
    reasoning_effort: str | None = None  # None: the server's default; "none": thinking off
    tool_choice: str | None = None  # "none" for compaction summaries
    extension: dict[str, Any] | None = None  # the `kvserve` request field (see docs/agent.md)


@dataclass
class ReplyBuilder:
    """Accumulates stream events into the assistant message."""

    content: str = ""
    reasoning: str = ""
    finish_reason: str = ""  # stays empty if the stream ends without saying why (a dropped connection)
    usage: Usage = field(default_factory=Usage)
    calls: dict[int, list[str]] = field(default_factory=dict)  # index -> [id, name, arguments]

    def add(self, event: StreamEvent) -> None:
        match event:
            case TextDelta(text):
                self.content += text
            case ReasoningDelta(text):
                self.reasoning += text
            case ToolCallDelta(index, call_id, name, arguments):
                call = self.calls.setdefault(index, ["", "", ""])
                call[0] = call_id or call[0]
                call[1] = name or call[1]
                call[2] += arguments
            case UsageReport(usage):
                self.usage = usage
            case Finished(reason):
                self.finish_reason = reason

    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(
            ToolCall(call_id or f"call_{index}", name, arguments)
            for index, (call_id, name, arguments) in sorted(self.calls.items())
        )

    def message(self) -> Message:
        return Message("assistant", self.content, self.reasoning, self.tool_calls())
