"""Responses wire -> ChatRequest. (The event encoder lives in encoder.py.)"""

from __future__ import annotations

import json
from typing import Any

from kvserve.api.errors import ApiError
from kvserve.api.extension import server_hints
from kvserve.api.image_reader import ImageReader
from kvserve.api.openai_responses.schema import InputContent, InputItem, ResponsesRequest
from kvserve.api.request_fields import (
    arguments_text,
    json_format,
    max_tokens,
    reasoning_from_effort,
    stop_list,
    top_logprobs,
)
from kvserve.chat.conversation import (
    ChatRequest,
    GenerationOptions,
    ImagePart,
    Message,
    NamedToolChoice,
    Part,
    ReasoningPart,
    Role,
    SamplingOptions,
    TextPart,
    ToolCallPart,
    ToolChoice,
    ToolResultPart,
)
from kvserve.chat.image_limits import DEFAULT_LIMITS, ImageLimits
from kvserve.chat.tools import flat_tool_name, tools_from_responses

_ROLES: dict[str, Role] = {
    "user": "user",
    "assistant": "assistant",
    "system": "system",
    "developer": "system",
}
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
# Bookkeeping items with nothing to render.
_IGNORED_ITEMS = ("compaction", "context_compaction", "item_reference")
_SUMMARY_OPT_IN = ("auto", "concise", "detailed")
LOGPROBS_INCLUDE = "message.output_text.logprobs"


def wants_reasoning_summary(wire: ResponsesRequest) -> bool:
    return wire.reasoning is not None and wire.reasoning.summary in _SUMMARY_OPT_IN


def wants_logprobs(wire: ResponsesRequest) -> bool:
    return LOGPROBS_INCLUDE in (wire.include or ())


def conversation(wire: ResponsesRequest, chat: ChatRequest) -> tuple[Message, ...]:
    """The messages to store for a continuation: everything but this request's instructions."""
    return chat.messages[1:] if wire.instructions else chat.messages


def to_chat_request(
    wire: ResponsesRequest, previous: tuple[Message, ...] = (), image_limits: ImageLimits = DEFAULT_LIMITS
) -> ChatRequest:
    """`previous` is the stored conversation of `previous_response_id`. Its instructions are not
    carried over (OpenAI semantics): only this request's `instructions` lead the prompt. Decodes
    every image of `input` (CPU-bound: call it off the event loop); `previous` ones were already."""
    messages: list[Message] = []
    if wire.instructions:
        messages.append(Message("system", (TextPart(wire.instructions),)))
    messages.extend(previous)
    items = (
        [InputItem(type="message", role="user", content=wire.input)]
        if isinstance(wire.input, str)
        else wire.input
    )
    messages.extend(_messages(items, ImageReader(image_limits)))
    if not messages:
        raise ApiError(400, "input must not be empty", param="input")
    options = GenerationOptions(
        sampling=SamplingOptions(
            temperature=wire.temperature,
            top_p=wire.top_p,
            top_k=wire.top_k,
            seed=wire.seed,
            logprobs=_logprobs(wire),
        ),
        stop=stop_list(wire.stop),
        max_tokens=max_tokens(wire.max_output_tokens, "max_output_tokens"),
        hints=server_hints(wire.kvserve),
    )
    effort = wire.reasoning.effort if wire.reasoning else None
    text_format = (wire.text or {}).get("format")
    return ChatRequest(
        messages=tuple(messages),
        options=options,
        tools=tools_from_responses(wire.tools or ()),
        tool_choice=_tool_choice(wire.tool_choice),
        reasoning=reasoning_from_effort(effort, "reasoning.effort"),
        response_format=json_format(text_format, "text.format"),
    )


def _logprobs(wire: ResponsesRequest) -> int | None:
    """On with `include: ["message.output_text.logprobs"]`; `top_logprobs` adds alternatives."""
    k = top_logprobs(wire.top_logprobs, "top_logprobs")
    return (k or 0) if wants_logprobs(wire) else None


def _tool_choice(value: str | dict[str, Any] | None) -> ToolChoice:
    if value is None or value in ("auto", "none", "required"):
        return value or "auto"  # type: ignore[return-value]
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return NamedToolChoice(value["name"])
    raise ApiError(
        400,
        'tool_choice must be "auto", "none", "required" or {"type": "function", "name": ...}',
        param="tool_choice",
    )


def _messages(items: list[InputItem], images: ImageReader) -> list[Message]:
    folder = _ItemFolder(images)
    for i, item in enumerate(items):
        folder.add(item, f"input.{i}")
    return folder.finish()


class _ItemFolder:
    """Items -> messages: calls merge into the preceding assistant turn; reasoning attaches to the next."""

    def __init__(self, images: ImageReader) -> None:
        self.images = images
        self.messages: list[Message] = []
        self._reasoning: list[Part] = []

    def add(self, item: InputItem, param: str) -> None:
        kind = item.type
        if kind == "message":
            self._message(item, param)
        elif kind == "reasoning":
            self._reasoning.append(ReasoningPart(_reasoning_text(item)))
        elif kind in ("function_call", "custom_tool_call"):
            self._assistant([_tool_call(item)])
        elif kind.endswith("_call_output") or kind == "tool_search_output":
            self.messages.append(self._tool_output(item, param))
        elif kind.endswith("_call"):  # hosted calls replayed in history (local_shell_call, ...)
            self._assistant([ToolCallPart(_call_id(item), kind.removesuffix("_call"), "{}")])
        elif kind not in _IGNORED_ITEMS:
            raise ApiError(400, f"{param}: unsupported input item type {kind!r}", param=f"{param}.type")

    def _tool_output(self, item: InputItem, param: str) -> Message:
        """A tool message: the output's text, then the images of a content-array output."""
        found: list[ImagePart] = []
        if isinstance(item.output, list):
            for k, part in enumerate(item.output):
                if isinstance(part, dict) and part.get("type") == "input_image":
                    found.append(_image(part.get("image_url"), f"{param}.output.{k}", self.images))
        result = ToolResultPart(_call_id(item), _output_text(item.output))
        return Message("tool", (result, *found))

    def finish(self) -> list[Message]:
        self._flush_reasoning()
        return self.messages

    def _message(self, item: InputItem, param: str) -> None:
        role = _ROLES.get(item.role or "user")
        if role is None:
            raise ApiError(400, f"{param}.role: unknown role {item.role!r}", param=f"{param}.role")
        parts = _content(item.content, param, self.images)
        if role == "assistant":
            self._assistant(parts)
        else:
            self._flush_reasoning()
            self.messages.append(Message(role, tuple(parts)))

    def _assistant(self, parts: list[Part]) -> None:
        parts, self._reasoning = [*self._reasoning, *parts], []
        last = self.messages[-1] if self.messages else None
        has_reasoning = any(isinstance(p, ReasoningPart) for p in parts)
        if last is not None and last.role == "assistant" and not has_reasoning:
            self.messages[-1] = Message("assistant", last.parts + tuple(parts))
        else:
            self.messages.append(Message("assistant", tuple(parts)))

    def _flush_reasoning(self) -> None:
        """Reasoning with no assistant turn after it stands as its own turn."""
        if self._reasoning:
            self.messages.append(Message("assistant", tuple(self._reasoning)))
            self._reasoning = []


def _call_id(item: InputItem) -> str:
    return item.call_id or item.id or ""


def _reasoning_text(item: InputItem) -> str:
    text = "".join(p.text or "" for p in (item.summary or []))
    return text + "".join(p.text or "" for p in (item.content or []) if isinstance(p, InputContent))


def _tool_call(item: InputItem) -> ToolCallPart:
    name = item.name or ""
    if item.namespace:
        name = flat_tool_name(item.namespace, name)
    if item.type == "function_call":
        arguments = arguments_text({} if item.arguments is None else item.arguments)
    else:  # a custom tool takes free text; it travels as the one `input` argument
        text = item.input if isinstance(item.input, str) else ""
        arguments = json.dumps({"input": text}, ensure_ascii=False)
    return ToolCallPart(_call_id(item), name, arguments)


def _content(content: str | list[InputContent] | None, param: str, images: ImageReader) -> list[Part]:
    if content is None:
        return []
    if isinstance(content, str):
        return [TextPart(content)]
    parts: list[Part] = []
    for k, part in enumerate(content):
        if part.type in _TEXT_PARTS:
            parts.append(TextPart(part.text or ""))
        elif part.type == "input_image":
            parts.append(_image(part.image_url, f"{param}.content.{k}", images))
        else:
            raise ApiError(
                400,
                f"{param}.content.{k}: unsupported content type {part.type!r}",
                param=f"{param}.content.{k}",
            )
    return parts


def _image(url: Any, param: str, images: ImageReader) -> ImagePart:
    if not isinstance(url, str):
        raise ApiError(
            400, f"{param}: an input_image needs an image_url (file_id is not supported)", param=param
        )
    return images.from_url(url, param)


def _output_text(output: Any) -> str:
    if output is None:
        return ""
    if isinstance(output, str):
        return output
    if isinstance(output, list):  # content array
        return "".join(
            p.get("text", "") for p in output if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return json.dumps(output, ensure_ascii=False)
