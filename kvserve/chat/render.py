"""Render a ChatRequest into prompt text with the model's Jinja chat template.

Same semantics as Hugging Face `apply_chat_template` (sandboxed Jinja, `trim_blocks` and
`lstrip_blocks`, `raise_exception`, `tojson`, `strftime_now`, special-token variables),
without importing transformers: the template comes from the model file and is trusted
only as far as the sandbox allows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar

import jinja2
from jinja2 import meta, nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kvserve.chat.conversation import ChatRequest, ImagePart, Message, TextPart, ToolResultPart
from kvserve.chat.hermes_tools import hermes_messages
from kvserve.chat.system_order import system_before_user

if TYPE_CHECKING:
    from kvserve.chat.image import Image

# Closing markers that templates wrap tool results in. A result containing its own closer would end
# the block early, so only that closer is escaped (ref §5.2); `<`, `>`, `&` in code stay as they are.
RESULT_CLOSERS = ("</tool_response>", "</tool_result>")

# Used when the model file has no template (base models): plain ChatML.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template refused the conversation (raise_exception) or failed on it; a client 400."""


class _GenerationTag(Extension):
    """`{% generation %}…{% endgeneration %}` marks assistant spans for training masks in HF;
    for inference it only has to render its body."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # HF overrides Jinja's tojson: no HTML escaping, non-ASCII kept as is.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    return _environment().from_string(source)


@lru_cache(maxsize=8)
def renders_tools(source: str) -> bool:
    """Whether a template reads the `tools` variable (a free variable of the template, not a local)."""
    return "tools" in meta.find_undeclared_variables(_environment().parse(source))


class ChatRenderer:
    """Renders conversations for one model. `special_tokens` maps bos_token/eos_token/... to text."""

    def __init__(self, template: str | None, special_tokens: Mapping[str, str] | None = None):
        self.template_source = template or CHATML_TEMPLATE
        self.special_tokens = dict(special_tokens or {})
        try:
            self._template = _compile(self.template_source)
        except jinja2.TemplateSyntaxError as error:
            raise ValueError(f"the model's chat template does not compile: {error}") from error
        # A template that ignores `tools` (SmolLM2's ChatML, the fallback above) gets the tools, calls
        # and results written into the messages Hermes-style instead (chat/hermes_tools.py).
        self.renders_tools = renders_tools(self.template_source)
        self.result_closers = tuple(c for c in RESULT_CLOSERS if c in self.template_source)
        # Vision models' templates (SmolVLM's) read every message's content as a list of parts.
        self.content_as_parts = _wants_content_parts(self._template)

    def render(self, request: ChatRequest, add_generation_prompt: bool = True) -> str:
        messages = self._messages(request)
        context: dict[str, Any] = {
            **self.special_tokens,
            "messages": to_template_messages(messages, self.result_closers, self.content_as_parts),
            "add_generation_prompt": add_generation_prompt,
        }
        if request.active_tools and self.renders_tools:
            context["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in request.active_tools
            ]
        if request.reasoning.enabled is not None:  # Qwen3-style switch; ignored by other templates
            context["enable_thinking"] = request.reasoning.enabled
        if request.reasoning.effort is not None:
            context["reasoning_effort"] = request.reasoning.effort
        try:
            return self._template.render(**context)
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as error:
            raise ChatTemplateError(f"chat template error: {error}") from error
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as error:
            # A template written for other message shapes (e.g. content None); the request is at fault.
            raise ChatTemplateError(f"chat template cannot render this conversation: {error}") from error

    def images(self, request: ChatRequest) -> tuple[Image, ...]:
        """The request's images in the order `render` writes their placeholders."""
        return tuple(p.image for m in self._messages(request) for p in m.parts if isinstance(p, ImagePart))

    def _messages(self, request: ChatRequest) -> tuple[Message, ...]:
        """The messages as the template sees them: system first, tools Hermes-style if it has none."""
        messages = system_before_user(request.messages)
        if not self.renders_tools:
            messages = hermes_messages(messages, request.active_tools)
        return messages


_PROBE = "kvserve-probe-7f3a"


def _wants_content_parts(template: jinja2.Template) -> bool:
    """Whether the template drops text given as a plain string but renders it as a text part: a
    vision template that iterates `message['content']` as parts (SmolVLM's). Probed once."""

    def renders(content: Any) -> bool:
        try:
            return _PROBE in template.render(messages=[{"role": "user", "content": content}])
        except Exception:  # noqa: BLE001 (any template failure means: not this form)
            return False

    return not renders(_PROBE) and renders([{"type": "text", "text": _PROBE}])


def escape_result(text: str, closers: tuple[str, ...]) -> str:
    """Tool-result text with only the wrapper's own closing marker escaped (`</x>` -> `&lt;/x>`)."""
    for closer in closers:
        text = text.replace(closer, "&lt;" + closer[1:])
    return text


def to_template_messages(
    messages: tuple[Message, ...], result_closers: tuple[str, ...] = (), content_as_parts: bool = False
) -> list[dict[str, Any]]:
    """Canonical messages -> the dict shapes HF templates expect; `content_as_parts` gives every
    content as a list of parts (`[{"type": "text", ...}, {"type": "image"}]`), as processors of
    vision models pass it."""
    names_by_call_id = {c.id: c.name for m in messages for c in m.tool_calls}
    out = [_to_template_message(m, names_by_call_id, result_closers) for m in messages]
    if content_as_parts:
        for message in out:
            if isinstance(message["content"], str):
                message["content"] = [{"type": "text", "text": message["content"]}]
    return out


def _to_template_message(
    message: Message, names_by_call_id: dict[str, str], result_closers: tuple[str, ...]
) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": _template_content(message, result_closers)}
    if message.role == "assistant":
        if message.reasoning:
            out["reasoning_content"] = message.reasoning
        if message.replay is not None:
            # The model's own bytes: after the generation prompt it wrote its text, then these calls.
            # The template renders them as content, so it must not render the calls again.
            out["content"] = message.text + message.replay
        elif message.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": _parse_arguments(c.arguments)},
                }
                for c in message.tool_calls
            ]
    if message.role == "tool":
        result = next((p for p in message.parts if isinstance(p, ToolResultPart)), None)
        if result is not None:
            out["tool_call_id"] = result.tool_call_id
            if result.tool_call_id in names_by_call_id:
                out["name"] = names_by_call_id[result.tool_call_id]
    return out


def _template_content(message: Message, result_closers: tuple[str, ...]) -> str | list[dict[str, Any]]:
    # Templates concatenate `content` as a string; only multimodal messages get the list form.
    results = "".join(p.content for p in message.parts if isinstance(p, ToolResultPart))
    text = message.text + escape_result(results, result_closers)
    if not message.has_images:
        return text
    parts: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, ImagePart):
            parts.append({"type": "image"})  # HF templates write the placeholder; pixels go to the model
        elif isinstance(part, TextPart):
            parts.append({"type": "text", "text": part.text})
        elif isinstance(part, ToolResultPart):
            parts.append({"type": "text", "text": escape_result(part.content, result_closers)})
    return parts


def _parse_arguments(arguments: str) -> Any:
    """HF templates expect a dict (they `tojson` it); keep the text when it is not a JSON object."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments
