"""The agent's conversation model: typed messages, turned into wire dicts only by `client.py`
and into JSON only by `session.py`."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolCall:
    call_id: str
    name: str
    arguments: str  # JSON text exactly as the model produced it

    def parsed_arguments(self) -> dict[str, Any]:
        """The arguments as an object; raises ValueError with a message the model can act on."""
        try:
            value = json.loads(self.arguments or "{}")
        except json.JSONDecodeError as error:
            raise ValueError(f"arguments are not valid JSON ({error.msg} at {error.pos})") from None
        if not isinstance(value, dict):
            raise ValueError("arguments must be a JSON object")  # noqa: TRY004 (one error type for callers)
        return value


@dataclass(frozen=True)
class Message:
    role: Role
    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None  # role "tool": the call this answers
    name: str | None = None  # role "tool": the tool's name (Anthropic needs none, logs like it)
    image: str | None = None  # role "tool": a `data:image/...;base64,` URI the result shows (view_image)
    is_internal: bool = False  # written by the agent itself (compaction notes, retry hints)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Message:
        calls = tuple(ToolCall(**call) for call in data.get("tool_calls", ()))
        return cls(**{**data, "tool_calls": calls})


@dataclass
class Usage:
    """Token counts of one response, as the server reported them."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens
