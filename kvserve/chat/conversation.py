"""The canonical conversation: what every chat API is translated into before rendering.

Wire adapters build these; the renderer and ChatService read them. Nothing here knows
about a protocol's field names, so the three chat APIs share one pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # the type only: Pillow loads with the API server, not with every `kvserve` command
    from kvserve.chat.image import Image

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class TextPart:
    text: str


@dataclass(frozen=True)
class ReasoningPart:
    """Reasoning a model produced earlier (rendered back only where the template wants it)."""

    text: str


@dataclass(frozen=True)
class ToolCallPart:
    """A call the assistant made. `arguments` is the JSON text as the client sent it."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolResultPart:
    """Images the tool returned (a screenshot) follow it in its tool message as ImageParts."""

    tool_call_id: str
    content: str
    is_error: bool = False


@dataclass(frozen=True)
class ImagePart:
    """A decoded, validated image (chat/image.py); URLs and paths are rejected at the edge."""

    image: Image


Part = TextPart | ReasoningPart | ToolCallPart | ToolResultPart | ImagePart


@dataclass(frozen=True)
class Message:
    """`replay` is set (by ChatService, from tool replay memory) on an assistant turn whose calls the
    model sampled here: the exact sampled markup of those calls, rendered instead of re-serializing
    them, so the prompt repeats the sampled bytes and the next turn hits the KV prefix cache."""

    role: Role
    parts: tuple[Part, ...] = ()
    replay: str | None = None

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))

    @property
    def reasoning(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, ReasoningPart))

    @property
    def tool_calls(self) -> tuple[ToolCallPart, ...]:
        return tuple(p for p in self.parts if isinstance(p, ToolCallPart))

    @property
    def images(self) -> tuple[ImagePart, ...]:
        return tuple(p for p in self.parts if isinstance(p, ImagePart))

    @property
    def has_images(self) -> bool:
        return any(isinstance(p, ImagePart) for p in self.parts)


ToolKind = Literal["function", "custom"]


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call; `parameters` is a JSON Schema object (key order kept).

    `name` is what the model sees: for a tool inside a Responses namespace it is the flattened
    `namespace__name` (chat/tools.py), and `namespace` keeps the client's pair so outputs can be
    split back. `kind` "custom" is a free-text tool (one string argument `input`); `strict` is the
    client's flag, passed on to constrained decoding."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    namespace: str | None = None
    kind: ToolKind = "function"
    strict: bool | None = None

    @property
    def wire_name(self) -> str:
        """The name as the client spelled it (without the namespace prefix)."""
        if self.namespace is None:
            return self.name
        return self.name.removeprefix(self.namespace).removeprefix(NAMESPACE_SEPARATOR)


# Responses namespace tools (Codex's MCP servers) are offered to the model as `namespace__name`.
NAMESPACE_SEPARATOR = "__"


@dataclass(frozen=True)
class NamedToolChoice:
    name: str


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice


@dataclass(frozen=True)
class JsonFormat:
    """The answer must be JSON (`response_format`, Responses `text.format`): an object valid against
    `schema` (a JSON Schema, key order kept), or any JSON object when `schema` is None."""

    schema: dict[str, Any] | None = None


@dataclass(frozen=True)
class ReasoningControl:
    """`enabled=None` leaves the model's default; `effort` is the client's word (low/medium/high/...)."""

    enabled: bool | None = None
    effort: str | None = None


@dataclass(frozen=True)
class SamplingOptions:
    """Sampling as the client asked; None = the server default. Validated by the engine's params."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logprobs: int | None = None  # None: off; 0: sampled token only; k: plus the top k
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    ignore_eos: bool = False


@dataclass(frozen=True)
class ServerHints:
    """kvserve's own request extension (the `kvserve` field, sent by its agent): explicit disk
    checkpoints of this request, and prefill progress in the stream."""

    session_id: str | None = None
    save_session: bool = False  # prompt + reply, reason agent_session
    save_system: bool = False  # the system prompt + tools prefix, reason agent_system
    prefill_progress: bool = False  # SSE comments with the prefill counts while the prompt prefills


@dataclass(frozen=True)
class GenerationOptions:
    """What every request carries, chat or raw prompt."""

    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    stop: tuple[str, ...] = ()
    max_tokens: int | None = None  # None: up to the context limit
    hints: ServerHints = field(default_factory=ServerHints)


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[Message, ...]
    options: GenerationOptions = field(default_factory=GenerationOptions)
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = "auto"
    reasoning: ReasoningControl = field(default_factory=ReasoningControl)
    response_format: JsonFormat | None = None  # enforced by constrained decoding

    @property
    def active_tools(self) -> tuple[ToolSpec, ...]:
        """Tools offered to the model: none at all with tool_choice "none"."""
        return () if self.tool_choice == "none" else self.tools


@dataclass(frozen=True)
class TextRequest:
    """A raw-prompt completion (legacy /v1/completions): no chat template."""

    prompt: str
    options: GenerationOptions = field(default_factory=GenerationOptions)
    response_format: JsonFormat | None = None
