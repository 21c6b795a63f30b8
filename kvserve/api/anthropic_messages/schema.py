"""Anthropic Messages request wire models."""

from __future__ import annotations

from typing import Any

from kvserve.api.extension import KvserveExtension
from kvserve.api.wire import WireModel


class ContentBlock(WireModel):
    type: str
    text: str | None = None
    thinking: str | None = None
    signature: str | None = None
    id: str | None = None
    name: str | None = None
    input: Any = None
    tool_use_id: str | None = None
    content: str | list[ContentBlock] | None = None  # tool_result content
    is_error: bool | None = None
    source: dict[str, Any] | None = None  # image


class MessageParam(WireModel):
    role: str
    content: str | list[ContentBlock]


class SystemBlock(WireModel):
    type: str = "text"
    text: str


class ToolParam(WireModel):
    name: str
    type: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class MessagesRequest(WireModel):
    messages: list[MessageParam]
    model: str | None = None
    max_tokens: int | None = None
    system: str | list[SystemBlock] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    tools: list[ToolParam] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    kvserve: KvserveExtension | None = None  # kvserve's own extension (api/extension.py)
