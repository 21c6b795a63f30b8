"""Responses request wire models. Items and tools stay permissive: clients send many kinds."""

from __future__ import annotations

from typing import Any

from kvserve.api.extension import KvserveExtension
from kvserve.api.wire import WireModel


class InputContent(WireModel):
    type: str
    text: str | None = None
    image_url: str | None = None


class InputItem(WireModel):
    type: str = "message"
    id: str | None = None
    role: str | None = None
    content: str | list[InputContent] | None = None
    call_id: str | None = None
    name: str | None = None
    namespace: str | None = None
    arguments: Any = None
    input: Any = None
    output: Any = None
    summary: list[InputContent] | None = None
    status: str | None = None


class ReasoningParam(WireModel):
    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(WireModel):
    input: str | list[InputItem]
    model: str | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    stream: bool = False
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    reasoning: ReasoningParam | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None
    kvserve: KvserveExtension | None = None  # kvserve's own extension (api/extension.py)
