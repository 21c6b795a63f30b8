"""Fold a GenerationEvent stream into one result (non-streaming responses of every protocol)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from kvserve.serving.events import (
    Failed,
    Finished,
    FinishReason,
    GenerationEvent,
    Logprobs,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)


@dataclass
class ToolCall:
    id: str  # protocol-neutral hex; encoders add their prefix
    name: str
    arguments: str = ""


@dataclass
class GenerationResult:
    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=lambda: Usage(0, 0, 0))
    finish_reason: FinishReason = "stop"
    stop_sequence: str | None = None
    error: str | None = None  # set when the stream ended with Failed
    logprobs: list[TokenLogprob] = field(default_factory=list)  # empty unless the request asked

    def add(self, event: GenerationEvent) -> None:
        match event:
            case TextDelta(text):
                self.text += text
            case ReasoningDelta(text):
                self.reasoning += text
            case ToolCallStart(_, call_id, name):
                self.tool_calls.append(ToolCall(call_id, name))
            case ToolCallArgsDelta(index, fragment):
                self.tool_calls[index].arguments += fragment
            case ToolCallEnd(index, arguments):
                self.tool_calls[index].arguments = arguments
            case Usage():
                self.usage = event
            case Finished(reason, stop_sequence):
                self.finish_reason, self.stop_sequence = reason, stop_sequence
            case Failed(error):
                self.error = error
            case Logprobs(tokens):
                self.logprobs.extend(tokens)


async def collect(events: AsyncIterator[GenerationEvent]) -> GenerationResult:
    result = GenerationResult()
    async for event in events:
        result.add(event)
    return result
