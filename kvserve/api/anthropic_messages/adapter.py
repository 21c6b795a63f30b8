"""Anthropic Messages wire <-> ChatRequest / GenerationEvents."""

from __future__ import annotations

import json
from typing import Any, Literal

from kvserve.api.anthropic_messages.schema import ContentBlock, MessageParam, MessagesRequest
from kvserve.api.errors import ApiError, anthropic_error_body
from kvserve.api.extension import server_hints
from kvserve.api.image_reader import ImageReader
from kvserve.api.request_fields import (
    arguments_text,
    max_tokens,
    reasoning_from_effort,
    stop_list,
)
from kvserve.api.sse import KEEPALIVE, event_frame, prefill_comment
from kvserve.chat.conversation import (
    ChatRequest,
    GenerationOptions,
    ImagePart,
    Message,
    NamedToolChoice,
    Part,
    ReasoningControl,
    ReasoningPart,
    SamplingOptions,
    TextPart,
    ToolCallPart,
    ToolChoice,
    ToolResultPart,
)
from kvserve.chat.image_limits import DEFAULT_LIMITS, ImageLimits
from kvserve.chat.tools import tools_from_anthropic
from kvserve.serving.events import (
    Failed,
    Finished,
    FinishReason,
    GenerationEvent,
    PrefillProgress,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)
from kvserve.serving.result import GenerationResult

# System parts whose text changes on every request (Claude Code's billing header): rendering them
# would make every prompt differ from the first token on and defeat the prefix cache.
_PRIVATE_SYSTEM_PREFIX = "x-anthropic-"


# -- request ---------------------------------------------------------------------------


def to_chat_request(wire: MessagesRequest, image_limits: ImageLimits = DEFAULT_LIMITS) -> ChatRequest:
    """Decodes every image (CPU-bound: call it off the event loop)."""
    if not wire.messages:
        raise ApiError(400, "messages: at least one message is required", param="messages")
    messages: list[Message] = []
    system = system_text(wire.system)
    if system:
        messages.append(Message("system", (TextPart(system),)))
    images = ImageReader(image_limits)
    for i, message in enumerate(wire.messages):
        messages.extend(_messages(message, i, images))
    options = GenerationOptions(
        sampling=SamplingOptions(temperature=wire.temperature, top_p=wire.top_p, top_k=wire.top_k),
        stop=stop_list(wire.stop_sequences),
        max_tokens=max_tokens(wire.max_tokens, "max_tokens"),
        hints=server_hints(wire.kvserve),
    )
    return ChatRequest(
        messages=tuple(messages),
        options=options,
        tools=tools_from_anthropic(t.model_dump(exclude_none=True) for t in wire.tools or ()),
        tool_choice=_tool_choice(wire.tool_choice),
        reasoning=_reasoning(wire),
    )


def system_text(system: str | list[Any] | None) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    text = ""
    for block in system:
        if block.text.startswith(_PRIVATE_SYSTEM_PREFIX):
            continue
        if text and not text.endswith("\n"):
            text += "\n"
        text += block.text
    return text


_THINKING_TYPES = ("enabled", "disabled", "adaptive")
# `thinking.budget_tokens` -> an effort word for templates that take one, when no effort is given.
_BUDGET_EFFORTS = ((4096, "low"), (16384, "medium"))


def _reasoning(wire: MessagesRequest) -> ReasoningControl:
    effort = (wire.output_config or {}).get("effort")
    if effort is not None and not isinstance(effort, str):
        raise ApiError(400, "output_config.effort must be a string", param="output_config.effort")
    control = reasoning_from_effort(effort, "output_config.effort")
    thinking = wire.thinking or {}
    kind = thinking.get("type")
    if kind is not None and kind not in _THINKING_TYPES:
        raise ApiError(
            400, 'thinking.type must be "enabled", "disabled" or "adaptive"', param="thinking.type"
        )
    if kind == "disabled":
        return ReasoningControl(enabled=False, effort=control.effort)
    if kind == "enabled":
        return ReasoningControl(enabled=True, effort=control.effort or _budget_effort(thinking))
    return control  # "adaptive" or absent: the model's default (or what the effort says)


def _budget_effort(thinking: dict[str, Any]) -> str | None:
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool):
        return None
    return next((effort for limit, effort in _BUDGET_EFFORTS if budget < limit), "high")


def _tool_choice(value: dict[str, Any] | None) -> ToolChoice:
    kind = (value or {}).get("type", "auto")
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(value.get("name"), str):  # type: ignore[union-attr]
        return NamedToolChoice(value["name"])  # type: ignore[index]
    raise ApiError(400, 'tool_choice.type must be "auto", "any", "tool" or "none"', param="tool_choice")


def _messages(message: MessageParam, index: int, images: ImageReader) -> list[Message]:
    """One wire message -> canonical messages; tool_result blocks become their own tool messages."""
    role = {"user": "user", "assistant": "assistant", "system": "system"}.get(message.role)
    if role is None:
        raise ApiError(
            400, f"messages.{index}.role: unknown role {message.role!r}", param=f"messages.{index}.role"
        )
    if isinstance(message.content, str):
        return [Message(role, (TextPart(message.content),))]  # type: ignore[arg-type]
    out: list[Message] = []
    pending: list[Part] = []
    for k, block in enumerate(message.content):
        param = f"messages.{index}.content.{k}"
        if block.type == "tool_result" and role == "user":
            if pending:
                out.append(Message(role, tuple(pending)))
                pending = []
            out.append(_tool_result(block, param, images))
            continue
        part = _part(block, role, param, images)
        if part is not None:
            pending.append(part)
    if pending or not out:
        out.append(Message(role, tuple(pending)))  # type: ignore[arg-type]
    return out


def _part(block: ContentBlock, role: str, param: str, images: ImageReader) -> Part | None:
    if block.type == "text":
        return TextPart(block.text or "")
    if block.type == "thinking" and role == "assistant":
        return ReasoningPart(block.thinking or "")
    if block.type == "redacted_thinking":
        return None  # opaque to us
    if block.type == "tool_use" and role == "assistant":
        arguments = arguments_text({} if block.input is None else block.input)
        return ToolCallPart(block.id or "", block.name or "", arguments)
    if block.type == "image":
        return _image(block, param, images)
    raise ApiError(
        400, f"{param}: unsupported content block type {block.type!r} in a {role} message", param=param
    )


def _image(block: ContentBlock, param: str, images: ImageReader) -> ImagePart:
    source = block.source or {}
    data, media_type = source.get("data"), source.get("media_type")
    if source.get("type") == "base64" and isinstance(data, str) and isinstance(media_type, str):
        return images.from_base64(data, media_type, param)
    raise ApiError(
        400,
        f"{param}: images must be base64 sources with a media_type; the server does not fetch URLs "
        "or read files",
        param=param,
    )


def _tool_result(block: ContentBlock, param: str, images: ImageReader) -> Message:
    """A tool message: the result's text blocks joined, then its images."""
    content = block.content
    found: list[ImagePart] = []
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        text = ""
        for k, inner in enumerate(content):
            if inner.type == "text":
                text += inner.text or ""
            elif inner.type == "image":
                found.append(_image(inner, f"{param}.content.{k}", images))
    result = ToolResultPart(block.tool_use_id or "", text, is_error=bool(block.is_error))
    return Message("tool", (result, *found))


# -- response --------------------------------------------------------------------------


def stop_reason(reason: FinishReason, stop_sequence: str | None) -> str:
    if reason == "tool_calls":
        return "tool_use"
    if reason == "length":
        return "max_tokens"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        # Anthropic's three input counts add up to the prompt: read from cache, written to it, neither.
        "input_tokens": usage.uncached_prompt_tokens - usage.cache_write_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": usage.cache_write_tokens,
    }


def tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def to_response(result: GenerationResult, message_id: str, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if result.reasoning:
        content.append({"type": "thinking", "thinking": result.reasoning, "signature": message_id})
    if result.text:
        content.append({"type": "text", "text": result.text})
    for call in result.tool_calls:
        content.append(
            {
                "type": "tool_use",
                "id": f"toolu_{call.id}",
                "name": call.name,
                "input": tool_input(call.arguments),
            }
        )
    if not any(block["type"] != "thinking" for block in content):
        content.append({"type": "text", "text": ""})
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(result.finish_reason, result.stop_sequence),
        "stop_sequence": result.stop_sequence,
        "usage": usage_json(result.usage),
    }


BlockKind = Literal["thinking", "text", "tool_use"]


class MessagesStreamEncoder:
    """GenerationEvents -> Anthropic named SSE events (message_start ... message_stop)."""

    def __init__(self, message_id: str, model: str):
        self.message_id = message_id
        self.model = model
        self._started = False
        self._open: BlockKind | None = None
        self._index = -1
        self._kinds: list[BlockKind] = []
        self._args_streamed = False
        self._usage = Usage(0, 0, 0)

    def start(self) -> list[str]:
        return []  # message_start waits for the prefill so its usage carries the cache numbers

    def encode(self, event: GenerationEvent) -> list[str]:
        match event:
            case Usage():
                self._usage = event
                return self._ensure_started()
            case PrefillProgress(is_detailed=True):
                return [prefill_comment(event)]
            case PrefillProgress():
                return [event_frame("ping", {"type": "ping"})] if self._started else [KEEPALIVE]
            case ReasoningDelta(text):
                return self._block("thinking", {"type": "thinking", "thinking": "", "signature": ""}) + [
                    self._delta({"type": "thinking_delta", "thinking": text})
                ]
            case TextDelta(text):
                return self._block("text", {"type": "text", "text": ""}) + [
                    self._delta({"type": "text_delta", "text": text})
                ]
            case ToolCallStart(_, call_id, name):
                frames = self._ensure_started() + self._close()
                self._args_streamed = False
                return frames + self._open_block(
                    "tool_use", {"type": "tool_use", "id": f"toolu_{call_id}", "name": name, "input": {}}
                )
            case ToolCallArgsDelta(_, fragment):
                self._args_streamed = True
                return [self._delta({"type": "input_json_delta", "partial_json": fragment})]
            case ToolCallEnd(_, arguments):
                frames = (
                    []
                    if self._args_streamed
                    else [self._delta({"type": "input_json_delta", "partial_json": arguments})]
                )
                return frames + self._close()
            case Finished(reason, stop_sequence):
                return self._finish(reason, stop_sequence)
            case Failed(error):
                return [event_frame("error", anthropic_error_body(500, error))]
        return []

    def _finish(self, reason: FinishReason, stop_sequence: str | None) -> list[str]:
        frames = self._ensure_started() + self._close()
        if all(kind == "thinking" for kind in self._kinds):  # clients expect a text block
            frames += self._open_block("text", {"type": "text", "text": ""}) + self._close()
        frames.append(
            event_frame(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": stop_reason(reason, stop_sequence),
                        "stop_sequence": stop_sequence,
                    },
                    "usage": usage_json(self._usage),
                },
            )
        )
        frames.append(event_frame("message_stop", {"type": "message_stop"}))
        return frames

    def _ensure_started(self) -> list[str]:
        if self._started:
            return []
        self._started = True
        usage = {**usage_json(self._usage), "output_tokens": 0}
        message = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }
        return [
            event_frame("message_start", {"type": "message_start", "message": message}),
            event_frame("ping", {"type": "ping"}),
        ]

    def _block(self, kind: BlockKind, content_block: dict[str, Any]) -> list[str]:
        frames = self._ensure_started()
        if self._open == kind:
            return frames
        return frames + self._close() + self._open_block(kind, content_block)

    def _open_block(self, kind: BlockKind, content_block: dict[str, Any]) -> list[str]:
        self._open = kind
        self._index += 1
        self._kinds.append(kind)
        return [
            event_frame(
                "content_block_start",
                {"type": "content_block_start", "index": self._index, "content_block": content_block},
            )
        ]

    def _close(self) -> list[str]:
        if self._open is None:
            return []
        frames = []
        if self._open == "thinking":
            frames.append(self._delta({"type": "signature_delta", "signature": self.message_id}))
        frames.append(event_frame("content_block_stop", {"type": "content_block_stop", "index": self._index}))
        self._open = None
        return frames

    def _delta(self, delta: dict[str, Any]) -> str:
        return event_frame(
            "content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta}
        )
