"""GenerationEvents -> Responses output items and SSE events (each with a `sequence_number`).

One encoder serves both modes: the non-streaming route feeds it every event, drops the
frames and returns `response()`, so the two modes cannot disagree on the final object.
Items are closed as soon as the next one starts, as OpenAI does.
"""

from __future__ import annotations

import json
import time
from typing import Any

from kvserve.api.logprobs_json import token_logprob_json
from kvserve.api.request_fields import new_id
from kvserve.api.sse import event_frame, prefill_comment
from kvserve.chat.conversation import Message, Part, ReasoningPart, TextPart, ToolCallPart, ToolSpec
from kvserve.chat.tools import flat_tool_name, split_tool_name
from kvserve.serving.events import (
    Failed,
    Finished,
    GenerationEvent,
    Logprobs,
    PrefillProgress,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


class ResponsesEncoder:
    def __init__(
        self,
        response_id: str,
        model: str,
        echo: dict[str, Any],
        include_reasoning: bool,
        tools: tuple[ToolSpec, ...] = (),
    ):
        """`tools` are the request's (names of namespaced tools are split back for the client)."""
        self.response_id = response_id
        self.model = model
        self.echo = echo  # request fields repeated in every response object
        self.include_reasoning = include_reasoning
        self.tools = tools
        self.created_at = int(time.time())
        self.output: list[dict[str, Any]] = []
        self.status = "in_progress"
        self.error: dict[str, str] | None = None
        self.incomplete_details: dict[str, str] | None = None
        self._usage: Usage | None = None
        self._open: dict[str, Any] | None = None
        self._args_streamed = False
        self._sequence = 0
        self._logprobs: list[TokenLogprob] = []  # of text not streamed yet (only when asked)

    def response(self) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "model": self.model,
            "output": self.output,
            "usage": None if self._usage is None or self.status == "in_progress" else usage_json(self._usage),
            "error": self.error,
            "incomplete_details": self.incomplete_details,
            **self.echo,
        }

    def output_message(self) -> Message:
        """The output as the assistant turn a `previous_response_id` continuation replays."""
        parts: list[Part] = []
        for item in self.output:
            if item["type"] == "reasoning":
                parts.append(ReasoningPart(item["summary"][0]["text"]))
            elif item["type"] == "message":
                parts.append(TextPart(item["content"][0]["text"]))
            elif item["type"] == "function_call":
                name = (
                    flat_tool_name(item["namespace"], item["name"]) if "namespace" in item else item["name"]
                )
                parts.append(ToolCallPart(item["call_id"], name, item["arguments"]))
            elif item["type"] == "custom_tool_call":
                arguments = json.dumps({"input": item["input"]}, ensure_ascii=False)
                parts.append(ToolCallPart(item["call_id"], item["name"], arguments))
        return Message("assistant", tuple(parts))

    def start(self) -> list[str]:
        return [
            self._frame("response.created", response=self.response()),
            self._frame("response.in_progress", response=self.response()),
        ]

    def encode(self, event: GenerationEvent) -> list[str]:
        match event:
            case TextDelta(text):
                frames = self._ensure_message()
                item = self._open
                assert item is not None
                item["content"][0]["text"] += text
                logprobs = self._take_logprobs(item)
                return frames + [
                    self._frame(
                        "response.output_text.delta",
                        item_id=item["id"],
                        output_index=self._index,
                        content_index=0,
                        delta=text,
                        logprobs=logprobs,
                    )
                ]
            case ReasoningDelta(text):
                self._logprobs.clear()  # logprobs describe output_text only
                if not self.include_reasoning:
                    return []
                frames = self._ensure_reasoning()
                item = self._open
                assert item is not None
                item["summary"][0]["text"] += text
                return frames + [
                    self._frame(
                        "response.reasoning_summary_text.delta",
                        item_id=item["id"],
                        output_index=self._index,
                        summary_index=0,
                        delta=text,
                    )
                ]
            case ToolCallStart(_, call_id, name):
                self._logprobs.clear()
                return self._close() + self._open_item(self._function_call(call_id, name))
            case ToolCallArgsDelta(_, fragment):
                assert self._open is not None
                if self._open["type"] == "custom_tool_call":
                    return []  # JSON fragments of {"input": ...}; the input text is sent whole at the end
                self._open["arguments"] += fragment
                self._args_streamed = True
                return [
                    self._frame(
                        "response.function_call_arguments.delta",
                        item_id=self._open["id"],
                        output_index=self._index,
                        delta=fragment,
                    )
                ]
            case ToolCallEnd(_, arguments):
                assert self._open is not None
                if self._open["type"] == "custom_tool_call":
                    return self._end_custom_call(arguments)
                return self._end_call(arguments)
            case Usage():
                self._usage = event
            case Logprobs(tokens):
                self._logprobs.extend(tokens)
            case Finished(reason):
                # An item cut by the length limit (reasoning never closed, text cut) is incomplete.
                frames = self._close("incomplete" if reason == "length" else "completed")
                if reason == "length":
                    self.status, self.incomplete_details = "incomplete", {"reason": "max_output_tokens"}
                    return frames + [self._frame("response.incomplete", response=self.response())]
                self.status = "completed"
                return frames + [self._frame("response.completed", response=self.response())]
            case Failed(error):
                frames = self._close()
                self.status, self.error = "failed", {"code": "server_error", "message": error}
                return frames + [self._frame("response.failed", response=self.response())]
            case PrefillProgress(is_detailed=True):
                return [prefill_comment(event)]
            case PrefillProgress():
                # A keepalive as a real event, not an SSE comment: Codex's `stream_idle_timeout_ms`
                # (300 s by default) counts only events, and a cold 20K-token prefill on a CPU takes
                # longer. `response.in_progress` is the one event the protocol has for "still working";
                # the SDKs and Codex take it again without complaint.
                return [self._frame("response.in_progress", response=self.response())]
        return []

    # -- items -------------------------------------------------------------------------

    @property
    def _index(self) -> int:
        return len(self.output) - 1

    def _ensure_message(self) -> list[str]:
        if self._open is not None and self._open["type"] == "message":
            return []
        item = {
            "id": new_id("msg_"),
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        frames = self._close() + self._open_item(item)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        item["content"].append(part)
        return frames + [
            self._frame(
                "response.content_part.added",
                item_id=item["id"],
                output_index=self._index,
                content_index=0,
                part={**part},
            )
        ]

    def _ensure_reasoning(self) -> list[str]:
        if self._open is not None and self._open["type"] == "reasoning":
            return []
        item = {"id": new_id("rs_"), "type": "reasoning", "status": "in_progress", "summary": []}
        frames = self._close() + self._open_item(item)
        item["summary"].append({"type": "summary_text", "text": ""})
        return frames + [
            self._frame(
                "response.reasoning_summary_part.added",
                item_id=item["id"],
                output_index=self._index,
                summary_index=0,
                part={"type": "summary_text", "text": ""},
            )
        ]

    def _function_call(self, call_id: str, name: str) -> dict[str, Any]:
        if any(t.name == name and t.kind == "custom" for t in self.tools):
            return {
                "id": new_id("ctc_"),
                "type": "custom_tool_call",
                "status": "in_progress",
                "call_id": f"call_{call_id}",
                "name": name,
                "input": "",
            }
        item = {
            "id": new_id("fc_"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": f"call_{call_id}",
            "name": name,
            "arguments": "",
        }
        namespace, wire_name = split_tool_name(name, self.tools)
        if namespace is not None:  # give the client back its own namespace/name pair
            item["namespace"], item["name"] = namespace, wire_name
        self._args_streamed = False
        return item

    def _open_item(self, item: dict[str, Any]) -> list[str]:
        self.output.append(item)
        self._open = item
        return [self._frame("response.output_item.added", output_index=self._index, item=_snapshot(item))]

    def _end_call(self, arguments: str) -> list[str]:
        item = self._open
        assert item is not None and item["type"] == "function_call"
        frames = []
        if not self._args_streamed:
            frames.append(
                self._frame(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=self._index,
                    delta=arguments,
                )
            )
        item["arguments"] = arguments
        frames.append(
            self._frame(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=self._index,
                name=item["name"],
                arguments=arguments,
            )
        )
        return frames + self._close()

    def _end_custom_call(self, arguments: str) -> list[str]:
        """A free-text tool's call: the model wrote `{"input": TEXT}`; the client gets TEXT."""
        item = self._open
        assert item is not None
        item["input"] = custom_input(arguments)
        ids = {"item_id": item["id"], "output_index": self._index}
        return [
            self._frame("response.custom_tool_call_input.delta", **ids, delta=item["input"]),
            self._frame("response.custom_tool_call_input.done", **ids, input=item["input"]),
            *self._close(),
        ]

    def _close(self, status: str = "completed") -> list[str]:
        item, self._open = self._open, None
        if item is None:
            return []
        item["status"] = status
        frames = []
        if item["type"] == "message":
            part = item["content"][0]
            self._take_logprobs(item)  # tokens whose text was held back, then cut
            frames += [
                self._frame(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=self._index,
                    content_index=0,
                    text=part["text"],
                    logprobs=part["logprobs"],
                ),
                self._frame(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=self._index,
                    content_index=0,
                    part=dict(part),
                ),
            ]
        elif item["type"] == "reasoning":
            text = item["summary"][0]["text"]
            frames += [
                self._frame(
                    "response.reasoning_summary_text.done",
                    item_id=item["id"],
                    output_index=self._index,
                    summary_index=0,
                    text=text,
                ),
                self._frame(
                    "response.reasoning_summary_part.done",
                    item_id=item["id"],
                    output_index=self._index,
                    summary_index=0,
                    part={"type": "summary_text", "text": text},
                ),
            ]
        return frames + [
            self._frame("response.output_item.done", output_index=self._index, item=_snapshot(item))
        ]

    def _take_logprobs(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        """The pending logprobs as JSON, added to the message item's text part."""
        taken = [token_logprob_json(t) for t in self._logprobs]
        self._logprobs.clear()
        item["content"][0]["logprobs"].extend(taken)
        return taken

    def _frame(self, event_type: str, **payload: Any) -> str:
        frame = event_frame(event_type, {"type": event_type, "sequence_number": self._sequence, **payload})
        self._sequence += 1
        return frame


def custom_input(arguments: str) -> str:
    """The text of a custom tool call from its arguments JSON (`{"input": TEXT}`; else the JSON itself)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    text = value.get("input") if isinstance(value, dict) else None
    return text if isinstance(text, str) else arguments


def _snapshot(item: dict[str, Any]) -> dict[str, Any]:
    """A copy, so later in-place updates of the open item do not rewrite frames already built."""
    copy = dict(item)
    for key in ("content", "summary"):
        if key in copy:
            copy[key] = [dict(part) for part in copy[key]]
    return copy
