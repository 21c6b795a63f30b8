"""SSE payloads of the two wire protocols -> the agent's stream events."""

from __future__ import annotations

import json
from typing import Any

from kvserve.agent.events import (
    Finished,
    PrefillProgress,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    UsageReport,
    Waiting,
)
from kvserve.agent.messages import Usage

PROGRESS_COMMENT = "prefill_progress "


class StreamError(Exception):
    """The server reported an error inside the stream."""


def decode_comment(comment: str) -> StreamEvent:
    """An SSE comment (the line after its colon): kvserve's prefill counts, else a keepalive."""
    text = comment.strip()
    if not text.startswith(PROGRESS_COMMENT):
        return Waiting()
    try:
        counts = json.loads(text[len(PROGRESS_COMMENT) :])
        return PrefillProgress(
            int(counts["total"]), int(counts["cache"]), int(counts["processed"]), counts["time_ms"] / 1000
        )
    except (ValueError, KeyError, TypeError):  # another server's comment: still a sign of life
        return Waiting()


class OpenAIChatDecoder:
    def decode(self, data: str) -> list[StreamEvent]:
        if data == "[DONE]":
            return []
        chunk = json.loads(data)
        if "error" in chunk:
            raise StreamError(_error_text(chunk["error"]))
        events: list[StreamEvent] = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                events.append(ReasoningDelta(reasoning))
            if delta.get("content"):
                events.append(TextDelta(delta["content"]))
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                events.append(
                    ToolCallDelta(
                        call.get("index", 0),
                        call.get("id"),
                        function.get("name"),
                        function.get("arguments") or "",
                    )
                )
            if choice.get("finish_reason"):
                events.append(Finished(choice["finish_reason"]))
        if chunk.get("usage"):
            usage = chunk["usage"]
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            events.append(
                UsageReport(Usage(usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0), cached))
            )
        return events


_STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
}


class AnthropicDecoder:
    def __init__(self) -> None:
        self.usage = Usage()
        self.block_kinds: dict[int, str] = {}
        self.num_tool_blocks = 0
        self.tool_index: dict[int, int] = {}

    def decode(self, data: str) -> list[StreamEvent]:
        event = json.loads(data)
        kind = event.get("type")
        if kind == "error":
            raise StreamError(_error_text(event.get("error") or {}))
        if kind == "message_start":
            self._take_usage(event["message"].get("usage") or {})
        elif kind == "content_block_start":
            return self._block_start(event["index"], event["content_block"])
        elif kind == "content_block_delta":
            return self._block_delta(event["index"], event["delta"])
        elif kind == "message_delta":
            self._take_usage(event.get("usage") or {})
            reason = (event.get("delta") or {}).get("stop_reason") or "end_turn"
            return [UsageReport(self.usage), Finished(_STOP_REASONS.get(reason, "stop"))]
        return []

    def _take_usage(self, usage: dict[str, Any]) -> None:
        if "input_tokens" in usage:
            cached = usage.get("cache_read_input_tokens") or 0
            created = usage.get("cache_creation_input_tokens") or 0
            self.usage = Usage(usage["input_tokens"] + cached + created, self.usage.completion_tokens, cached)
        if "output_tokens" in usage:
            self.usage = Usage(self.usage.prompt_tokens, usage["output_tokens"], self.usage.cached_tokens)

    def _block_start(self, index: int, block: dict[str, Any]) -> list[StreamEvent]:
        self.block_kinds[index] = block.get("type", "text")
        if block.get("type") == "tool_use":
            self.tool_index[index] = self.num_tool_blocks
            self.num_tool_blocks += 1
            return [ToolCallDelta(self.tool_index[index], block.get("id"), block.get("name"))]
        if block.get("type") == "text" and block.get("text"):
            return [TextDelta(block["text"])]
        return []

    def _block_delta(self, index: int, delta: dict[str, Any]) -> list[StreamEvent]:
        match delta.get("type"):
            case "text_delta":
                return [TextDelta(delta.get("text", ""))]
            case "thinking_delta":
                return [ReasoningDelta(delta.get("thinking", ""))]
            case "input_json_delta" if index in self.tool_index:
                return [ToolCallDelta(self.tool_index[index], arguments=delta.get("partial_json", ""))]
        return []


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)
