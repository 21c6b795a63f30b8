"""The tool contract: a JSON schema the model sees, a handler run locally, and whether the user
must confirm it; plus the argument reader every handler uses so bad arguments read the same."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvserve.agent.workspace import ToolError, Workspace


class Args:
    """Typed access to a tool call's JSON arguments; mistakes raise ToolError naming the field."""

    def __init__(self, tool: str, values: dict[str, Any]):
        self.tool = tool
        self.values = values

    def text(self, name: str, default: str | None = None, allow_empty: bool = False) -> str:
        value = self.values.get(name, default)
        if value is None:
            raise ToolError(f"{self.tool}: missing required argument {name!r}")
        if not isinstance(value, str):
            raise ToolError(f"{self.tool}: {name!r} must be a string")
        if not value and not allow_empty:
            raise ToolError(f"{self.tool}: {name!r} must not be empty")
        return value

    def integer(self, name: str, default: int, lo: int, hi: int) -> int:
        value = self.values.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
            raise ToolError(f"{self.tool}: {name!r} must be an integer")
        if not lo <= value <= hi:
            raise ToolError(f"{self.tool}: {name!r} must be between {lo} and {hi}")
        return int(value)

    def flag(self, name: str, default: bool) -> bool:
        value = self.values.get(name, default)
        if not isinstance(value, bool):
            raise ToolError(f"{self.tool}: {name!r} must be true or false")
        return value

    def choice(self, name: str, default: str, options: tuple[str, ...]) -> str:
        value = self.text(name, default)
        if value not in options:
            raise ToolError(f"{self.tool}: {name!r} must be one of {', '.join(options)}")
        return value


@dataclass
class ToolContext:
    """What the tools share: the confinement, the per-session file state, and the cancel signal."""

    workspace: Workspace
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class ImageResult:
    """A tool result that shows the model an image beside its text (view_image)."""

    text: str
    data_uri: str  # data:image/...;base64,...


Handler = Callable[[Args], str | ImageResult]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema, sent on the wire as is
    handler: Handler
    needs_confirmation: bool = False
    summary_field: str | None = None  # the argument shown in the confirmation prompt

    def summarize(self, values: dict[str, Any]) -> str:
        """One line for the confirmation prompt and the transcript view."""
        shown = values.get(self.summary_field) if self.summary_field else None
        text = shown if isinstance(shown, str) else ", ".join(f"{k}={v!r}" for k, v in values.items())
        first = text.splitlines()[0] if text else ""
        return f"{self.name} {first[:160]}{' …' if len(text) > len(first[:160]) else ''}"


def schema(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required)}


def string(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


def integer(description: str) -> dict[str, Any]:
    return {"type": "integer", "description": description}


def boolean(description: str) -> dict[str, Any]:
    return {"type": "boolean", "description": description}
