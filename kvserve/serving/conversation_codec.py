"""Canonical messages <-> JSON-able dicts, for stores that outlive a request (response store)."""

from __future__ import annotations

import base64
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
from kvserve.chat.image import Image

_KINDS: dict[type, str] = {
    TextPart: "text",
    ReasoningPart: "reasoning",
    ToolCallPart: "tool_call",
    ToolResultPart: "tool_result",
    ImagePart: "image",
}
_CLASSES = {kind: cls for cls, kind in _KINDS.items()}


def encode_messages(messages: tuple[Message, ...] | list[Message]) -> list[dict[str, Any]]:
    return [{"role": m.role, "parts": [_encode_part(p) for p in m.parts]} for m in messages]


def _encode_part(part: Part) -> dict[str, Any]:
    if isinstance(part, ImagePart):
        image = part.image
        fields = {**vars(image), "data": base64.b64encode(image.data).decode()}
        return {"kind": "image", **fields}
    return {"kind": _KINDS[type(part)], **vars(part)}


def decode_messages(data: list[dict[str, Any]]) -> tuple[Message, ...]:
    return tuple(Message(m["role"], tuple(_part(p) for p in m["parts"])) for m in data)


def _part(data: dict[str, Any]) -> Part:
    fields = {k: v for k, v in data.items() if k != "kind"}
    if data["kind"] == "image":  # validated when it was first sent: stored as it was decoded then
        return ImagePart(Image(**{**fields, "data": base64.b64decode(fields["data"])}))
    return _CLASSES[data["kind"]](**fields)
