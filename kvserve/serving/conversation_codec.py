"""Canonical messages <-> JSON-able dicts, for stores that outlive a request (response store)."""

from __future__ import annotations

from typing import Any

from kvserve.chat.conversation import (
    ImagePart,
    Message,
    Part,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)

_KINDS: dict[type, str] = {
    TextPart: "text",
    ReasoningPart: "reasoning",
    ToolCallPart: "tool_call",
    ToolResultPart: "tool_result",
    ImagePart: "image",
}
_CLASSES = {kind: cls for cls, kind in _KINDS.items()}


def encode_messages(messages: tuple[Message, ...] | list[Message]) -> list[dict[str, Any]]:
    return [
        {"role": m.role, "parts": [{"kind": _KINDS[type(p)], **vars(p)} for p in m.parts]} for m in messages
    ]


def decode_messages(data: list[dict[str, Any]]) -> tuple[Message, ...]:
    return tuple(Message(m["role"], tuple(_part(p) for p in m["parts"])) for m in data)


def _part(data: dict[str, Any]) -> Part:
    fields = {k: v for k, v in data.items() if k != "kind"}
    return _CLASSES[data["kind"]](**fields)
