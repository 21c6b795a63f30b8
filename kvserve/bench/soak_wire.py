"""The soak's three streaming APIs as plain data: request bodies for one conversation turn, and a
stream reader that turns SSE events into what the next turn needs (the answer, the one tool call,
the Responses id). Pure: no I/O, so it is tested on recorded events in milliseconds.

A conversation is kept in a protocol-free form (`Turn`s) and written into each API's shape here,
so a retry resends exactly the same bytes and a follow-up carries the exact tool call id the
server gave (which is what tool replay and `previous_response_id` chains key on).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any


class SoakApi(enum.Enum):
    """The soak's APIs; not `endpoints.Api`, whose members are `bench serve`'s `--api` choices
    (Completions, no Responses) and which `client.StreamRecorder` reads."""

    CHAT = "chat"  # POST /v1/chat/completions
    RESPONSES = "responses"  # POST /v1/responses
    ANTHROPIC = "anthropic"  # POST /v1/messages

    @property
    def path(self) -> str:
        return {"chat": "/v1/chat/completions", "responses": "/v1/responses", "anthropic": "/v1/messages"}[
            self.value
        ]


# One tool every tool turn offers; the model is made to call it (tool_choice required/any).
TOOL_NAME = "read_file"
_TOOL_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string", "description": "file to read"}},
    "required": ["path"],
}


@dataclass(frozen=True)
class ToolCall:
    call_id: str
    name: str
    arguments: str  # the JSON text as streamed


@dataclass(frozen=True)
class Turn:
    """One exchange of a conversation: what the client sent and what came back."""

    user_text: str | None = None  # a user message, or None when the turn sends a tool result
    tool_result: str | None = None  # the result sent for the previous turn's tool call
    answer: str = ""
    tool_call: ToolCall | None = None
    response_id: str | None = None  # Responses: the id the next turn chains on


@dataclass(frozen=True)
class TurnRequest:
    """What the client sends next: a user message, or a tool result for the last turn's call."""

    user_text: str | None = None
    tool_result: str | None = None
    force_tool: bool = False
    max_tokens: int = 32


def request_body(
    api: SoakApi, system: str, history: list[Turn], request: TurnRequest, model: str, chain: bool = True
) -> dict[str, Any]:
    """The streaming body of the next turn. Responses chains on the previous turn's id when it has
    one (sending only the new input) unless `chain` is off; the others resend the whole history."""
    body: dict[str, Any] = {"model": model, "stream": True, "max_tokens": request.max_tokens}
    if api is SoakApi.CHAT:
        body["messages"] = [{"role": "system", "content": system}, *_chat_messages(history, request)]
        body["stream_options"] = {"include_usage": True}
    elif api is SoakApi.ANTHROPIC:
        body["system"] = system
        body["messages"] = _anthropic_messages(history, request)
    else:
        del body["max_tokens"]
        body["max_output_tokens"] = request.max_tokens
        body["store"] = True
        previous = history[-1].response_id if history and chain else None
        if previous is not None:
            body["previous_response_id"] = previous
            body["input"] = _responses_items(request, history[-1])
        else:
            body["instructions"] = system
            body["input"] = [i for t in history for i in _responses_turn_items(t)] + _responses_items(
                request, history[-1] if history else None
            )
    if request.force_tool:
        body["tools"] = [_tool_wire(api)]
        body["tool_choice"] = {SoakApi.ANTHROPIC: {"type": "any"}}.get(api, "required")
    return body


def _tool_wire(api: SoakApi) -> dict[str, Any]:
    description = "Read a file of the project"
    if api is SoakApi.ANTHROPIC:
        return {"name": TOOL_NAME, "description": description, "input_schema": _TOOL_SCHEMA}
    if api is SoakApi.RESPONSES:
        return {"type": "function", "name": TOOL_NAME, "description": description, "parameters": _TOOL_SCHEMA}
    function = {"name": TOOL_NAME, "description": description, "parameters": _TOOL_SCHEMA}
    return {"type": "function", "function": function}


def _chat_messages(history: list[Turn], request: TurnRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for turn in [*history, Turn(user_text=request.user_text, tool_result=request.tool_result)]:
        if turn.tool_result is not None:
            call = messages[-1]["tool_calls"][0]
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": turn.tool_result})
        if turn.user_text is not None:
            messages.append({"role": "user", "content": turn.user_text})
        if turn is not None and (turn.answer or turn.tool_call):
            message: dict[str, Any] = {"role": "assistant", "content": turn.answer or None}
            if turn.tool_call:
                function = {"name": turn.tool_call.name, "arguments": turn.tool_call.arguments}
                message["tool_calls"] = [
                    {"id": turn.tool_call.call_id, "type": "function", "function": function}
                ]
            messages.append(message)
    return messages


def _anthropic_messages(history: list[Turn], request: TurnRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for turn in [*history, Turn(user_text=request.user_text, tool_result=request.tool_result)]:
        if turn.tool_result is not None:
            call_id = messages[-1]["content"][-1]["id"]
            result = {"type": "tool_result", "tool_use_id": call_id, "content": turn.tool_result}
            messages.append({"role": "user", "content": [result]})
        if turn.user_text is not None:
            messages.append({"role": "user", "content": turn.user_text})
        if turn.answer or turn.tool_call:
            blocks: list[dict[str, Any]] = [{"type": "text", "text": turn.answer}] if turn.answer else []
            if turn.tool_call:
                call = turn.tool_call
                blocks.append(
                    {"type": "tool_use", "id": call.call_id, "name": call.name, "input": _args(call)}
                )
            messages.append({"role": "assistant", "content": blocks})
    return messages


def _responses_turn_items(turn: Turn) -> list[dict[str, Any]]:
    """A turn's items when the history is resent in full (no previous id to chain on)."""
    items: list[dict[str, Any]] = []
    if turn.user_text is not None:
        items.append({"type": "message", "role": "user", "content": turn.user_text})
    if turn.answer:
        items.append({"type": "message", "role": "assistant", "content": turn.answer})
    if turn.tool_call:
        call = turn.tool_call
        items.append(
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments}
        )
    return items


def _responses_items(request: TurnRequest, previous: Turn | None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if request.tool_result is not None:
        assert previous is not None and previous.tool_call is not None, "a tool result follows a call"
        items.append(
            {
                "type": "function_call_output",
                "call_id": previous.tool_call.call_id,
                "output": request.tool_result,
            }
        )
    if request.user_text is not None:
        items.append({"type": "message", "role": "user", "content": request.user_text})
    return items


def _args(call: ToolCall) -> dict[str, Any]:
    try:
        value = json.loads(call.arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass
class StreamReader:
    """Feed it each SSE event (`event:` name or None, `data:` payload); it says when generated
    content first arrived and, at the end, whether the stream was complete, and builds the `Turn`."""

    api: SoakApi
    num_content_events: int = 0
    is_done: bool = False
    error: str | None = None
    answer: list[str] = field(default_factory=list)
    response_id: str | None = None
    _call: dict[str, str] = field(default_factory=dict)

    def feed(self, event: str | None, payload: str) -> None:
        if payload.strip() == "[DONE]":
            self.is_done = self.api is SoakApi.CHAT
            return
        try:
            data = json.loads(payload)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            self.error = self.error or f"malformed SSE data: {payload[:120]!r}"
            return
        kind = event or data.get("type")
        if kind in ("error", "response.failed") or (self.api is SoakApi.CHAT and data.get("error")):
            self.error = self.error or f"error event: {payload[:300]}"
            return
        {SoakApi.CHAT: self._chat, SoakApi.RESPONSES: self._responses, SoakApi.ANTHROPIC: self._anthropic}[
            self.api
        ](kind, data)

    def _chat(self, kind: str | None, data: dict[str, Any]) -> None:
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            self._text(delta.get("content"))
            for call in delta.get("tool_calls") or []:
                self.num_content_events += 1
                if call.get("index", 0) != 0:
                    continue  # the soak follows the first call up
                function = call.get("function") or {}
                self._call_part(call.get("id"), function.get("name"), function.get("arguments"))

    def _responses(self, kind: str | None, data: dict[str, Any]) -> None:
        if kind == "response.created":
            self.response_id = (data.get("response") or {}).get("id")
        elif kind == "response.output_text.delta":
            self._text(data.get("delta"))
        elif kind == "response.function_call_arguments.delta":
            self.num_content_events += 1
        elif kind == "response.output_item.done":
            item = data.get("item") or {}
            if item.get("type") == "function_call" and not self._call:
                self._call_part(item.get("call_id"), item.get("name"), item.get("arguments"))
        elif kind in ("response.completed", "response.incomplete"):
            self.is_done = True

    def _anthropic(self, kind: str | None, data: dict[str, Any]) -> None:
        if kind == "content_block_start":
            block = data.get("content_block") or {}
            if block.get("type") == "tool_use" and not self._call:
                self._call_part(block.get("id"), block.get("name"), None)
        elif kind == "content_block_delta":
            delta = data.get("delta") or {}
            self._text(delta.get("text"))
            if delta.get("partial_json") is not None and "done" not in self._call:
                self.num_content_events += 1
                self._call_part(None, None, delta.get("partial_json"))
        elif kind == "content_block_stop" and self._call:
            self._call["done"] = "1"  # later blocks' calls are not followed up
        elif kind == "message_stop":
            self.is_done = True

    def _text(self, text: str | None) -> None:
        if text:
            self.num_content_events += 1
            self.answer.append(text)

    def _call_part(self, call_id: str | None, name: str | None, arguments: str | None) -> None:
        if call_id:
            self._call["id"] = call_id
        if name:
            self._call["name"] = name
        if arguments:
            self._call["arguments"] = self._call.get("arguments", "") + arguments

    def turn(self, request: TurnRequest) -> Turn:
        call = None
        if "id" in self._call and "name" in self._call:
            call = ToolCall(self._call["id"], self._call["name"], self._call.get("arguments") or "{}")
        return Turn(
            user_text=request.user_text,
            tool_result=request.tool_result,
            answer="".join(self.answer),
            tool_call=call,
            response_id=self.response_id,
        )
