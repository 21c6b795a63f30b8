"""Chat Completions wire <-> ChatRequest / GenerationEvents."""

from __future__ import annotations

import time
from typing import Any

from kvserve.api.errors import ApiError
from kvserve.api.extension import server_hints
from kvserve.api.image_reader import ImageReader
from kvserve.api.logprobs_json import token_logprob_json
from kvserve.api.openai_chat.schema import ChatCompletionRequest, ChatMessage, ContentPart
from kvserve.api.request_fields import (
    arguments_text,
    json_format,
    max_tokens,
    new_id,
    openai_sampling,
    reasoning_from_effort,
    stop_list,
    top_logprobs,
)
from kvserve.api.sse import DONE, FrameTemplate, data_frame, prefill_comment
from kvserve.chat.conversation import (
    ChatRequest,
    GenerationOptions,
    ImagePart,
    Message,
    NamedToolChoice,
    Part,
    ReasoningControl,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolChoice,
    ToolResultPart,
)
from kvserve.chat.image_limits import DEFAULT_LIMITS, ImageLimits
from kvserve.chat.tools import tools_from_openai
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
from kvserve.serving.result import GenerationResult

_ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
}


# -- request ---------------------------------------------------------------------------


def to_chat_request(wire: ChatCompletionRequest, image_limits: ImageLimits = DEFAULT_LIMITS) -> ChatRequest:
    """Decodes every image (CPU-bound: call it off the event loop)."""
    if wire.n is not None and wire.n != 1:
        raise ApiError(400, "only n=1 is supported", param="n")
    if not wire.messages:
        raise ApiError(400, "messages must not be empty", param="messages")
    limit = wire.max_completion_tokens if wire.max_completion_tokens is not None else wire.max_tokens
    options = GenerationOptions(
        sampling=openai_sampling(wire, _logprobs(wire)),
        stop=stop_list(wire.stop),
        max_tokens=max_tokens(limit, "max_tokens"),
        hints=server_hints(wire.kvserve),
    )
    images = ImageReader(image_limits)
    return ChatRequest(
        messages=tuple(_message(m, i, images) for i, m in enumerate(wire.messages)),
        options=options,
        tools=tools_from_openai(t.model_dump(exclude_none=True) for t in wire.tools or ()),
        tool_choice=tool_choice(wire.tool_choice),
        reasoning=_reasoning(wire),
        response_format=json_format(wire.response_format, "response_format"),
    )


def _reasoning(wire: ChatCompletionRequest) -> ReasoningControl:
    """`reasoning_effort` ("none" turns thinking off), overridden by an explicit switch: `thinking`
    (bool or {"type": "enabled"|"disabled"}) or `chat_template_kwargs.enable_thinking`."""
    control = reasoning_from_effort(wire.reasoning_effort)
    enabled = _thinking_switch(wire.thinking)
    kwargs = wire.chat_template_kwargs or {}
    if enabled is None and isinstance(kwargs.get("enable_thinking"), bool):
        enabled = kwargs["enable_thinking"]
    return control if enabled is None else ReasoningControl(enabled=enabled, effort=control.effort)


def _thinking_switch(value: bool | dict[str, Any] | None) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    kind = value.get("type")
    if kind not in ("enabled", "disabled"):
        raise ApiError(400, 'thinking.type must be "enabled" or "disabled"', param="thinking.type")
    return kind == "enabled"


def _logprobs(wire: ChatCompletionRequest) -> int | None:
    """`logprobs: true` turns them on; `top_logprobs` (0-20) adds alternatives and needs it."""
    k = top_logprobs(wire.top_logprobs, "top_logprobs")
    if not wire.logprobs:
        if k:
            raise ApiError(400, "top_logprobs requires logprobs to be true", param="top_logprobs")
        return None
    return k or 0


def tool_choice(value: str | dict[str, Any] | None) -> ToolChoice:
    if value is None:
        return "auto"
    if value in ("auto", "none", "required"):
        return value  # type: ignore[return-value]
    if isinstance(value, dict):
        name = (value.get("function") or {}).get("name") if isinstance(value.get("function"), dict) else None
        if value.get("type") == "function" and isinstance(name, str):
            return NamedToolChoice(name)
    raise ApiError(
        400, 'tool_choice must be "auto", "none", "required" or a named function', param="tool_choice"
    )


def _message(message: ChatMessage, index: int, images: ImageReader) -> Message:
    role = _ROLES.get(message.role)
    if role is None:
        raise ApiError(400, f"unknown role {message.role!r}", param=f"messages.{index}.role")
    parts: list[Part] = []
    if role == "assistant" and (message.reasoning_content or message.reasoning):
        parts.append(ReasoningPart(message.reasoning_content or message.reasoning or ""))
    content = _content_parts(message.content, index, images)
    if role == "tool":  # its image parts (a screenshot the tool took) follow the result
        text = "".join(p.text for p in content if isinstance(p, TextPart))
        result = ToolResultPart(message.tool_call_id or "", text)
        return Message("tool", (result, *(p for p in content if isinstance(p, ImagePart))))
    parts.extend(content)
    for call in message.tool_calls or ():
        parts.append(
            ToolCallPart(
                call.id or new_id("call_"), call.function.name, arguments_text(call.function.arguments)
            )
        )
    return Message(role, tuple(parts))


def _content_parts(content: str | list[ContentPart] | None, index: int, images: ImageReader) -> list[Part]:
    if content is None:
        return []
    if isinstance(content, str):
        return [TextPart(content)]
    parts: list[Part] = []
    for k, part in enumerate(content):
        param = f"messages.{index}.content.{k}"
        if part.type in ("text", "input_text") and part.text is not None:
            parts.append(TextPart(part.text))
        elif part.type == "image_url" and part.image_url is not None:
            parts.append(images.from_url(part.image_url.url, param))
        else:
            raise ApiError(400, f"unsupported content part of type {part.type!r}", param=param)
    return parts


# -- response --------------------------------------------------------------------------


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def tool_call_json(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": f"call_{call_id}", "type": "function", "function": {"name": name, "arguments": arguments}}


def logprobs_json(tokens: list[TokenLogprob]) -> dict[str, Any]:
    """`choices[].logprobs` of Chat Completions."""
    return {"content": [token_logprob_json(t) for t in tokens], "refusal": None}


def to_response(
    result: GenerationResult, completion_id: str, model: str, logprobs: bool = False
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": result.text}
    if result.reasoning:
        message["reasoning_content"] = result.reasoning
    if result.tool_calls:
        message["tool_calls"] = [tool_call_json(c.id, c.name, c.arguments) for c in result.tool_calls]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": logprobs_json(result.logprobs) if logprobs else None,
                "finish_reason": result.finish_reason,
            }
        ],
        "usage": usage_json(result.usage),
    }


class ChatStreamEncoder:
    """GenerationEvents -> `chat.completion.chunk` SSE frames, ending with `data: [DONE]`.

    Logprobs ride on the next chunk that carries output (the text of their tokens may be held
    back by the detokenizer or the stop matcher); what is left goes with the finish chunk.
    """

    def __init__(self, completion_id: str, model: str, include_usage: bool):
        self.completion_id = completion_id
        self.model = model
        self.include_usage = include_usage
        self.created = int(time.time())
        self._usage: Usage | None = None
        self._args_streamed: set[int] = set()
        self._logprobs: list[TokenLogprob] = []
        choice = {
            "index": 0,
            "delta": {"content": FrameTemplate.MARKER},
            "logprobs": None,
            "finish_reason": None,
        }
        self._content_frame = FrameTemplate(self._envelope([choice]))

    def start(self) -> list[str]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def encode(self, event: GenerationEvent) -> list[str]:
        match event:
            case TextDelta(text):
                return [self._chunk({"content": text}) if self._logprobs else self._content_frame.frame(text)]
            case ReasoningDelta(text):
                return [self._chunk({"reasoning_content": text})]
            case ToolCallStart(index, call_id, name):
                call = {"index": index, **tool_call_json(call_id, name, "")}
                return [self._chunk({"tool_calls": [call]})]
            case ToolCallArgsDelta(index, fragment):
                self._args_streamed.add(index)
                return [self._chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})]
            case ToolCallEnd(index, arguments):
                if index in self._args_streamed:
                    return []
                return [self._chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments}}]})]
            case Usage():
                self._usage = event
                return []
            case Logprobs(tokens):
                self._logprobs.extend(tokens)
                return []
            case Finished(reason):
                frames = [self._chunk({}, reason)]
                if self.include_usage and self._usage is not None:
                    frames.append(data_frame(self._envelope([], usage_json(self._usage))))
                return [*frames, DONE]
            case Failed(error):
                body = {"error": {"message": error, "type": "server_error", "param": None, "code": None}}
                return [data_frame(body), DONE]
            case PrefillProgress():
                return [prefill_comment(event)]
        return []

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> str:
        logprobs = logprobs_json(self._logprobs) if self._logprobs else None
        self._logprobs = []
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return data_frame(self._envelope([choice]))

    def _envelope(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            chunk["usage"] = usage
        return chunk
