"""Chat Completions request wire models (response bodies are built by the adapter as dicts)."""

from __future__ import annotations

from typing import Any

from kvserve.api.extension import KvserveExtension
from kvserve.api.wire import WireModel


class ImageUrl(WireModel):
    url: str
    detail: str | None = None


class ContentPart(WireModel):
    type: str
    text: str | None = None
    image_url: ImageUrl | None = None


class FunctionCall(WireModel):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(WireModel):
    id: str | None = None
    type: str = "function"
    function: FunctionCall


class ChatMessage(WireModel):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class FunctionDef(WireModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(WireModel):
    type: str = "function"
    function: FunctionDef | None = None


class StreamOptions(WireModel):
    include_usage: bool = False


class ChatCompletionRequest(WireModel):
    messages: list[ChatMessage]
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    logit_bias: dict[str, float] | None = None
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    reasoning_effort: str | None = None
    thinking: bool | dict[str, Any] | None = None  # ds4 / DeepSeek style switch
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM style: {"enable_thinking": false}
    response_format: dict[str, Any] | None = None
    ignore_eos: bool = False
    kvserve: KvserveExtension | None = None  # kvserve's own extension (api/extension.py)
