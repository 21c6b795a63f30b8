"""Sessions as JSON files under `<data dir>/agent/sessions/`: the transcript plus what the status bar
needs, saved atomically after every turn and resumable by name (`--session`) or as the last (`-c`)."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvserve.agent.messages import Message, Usage

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
FORMAT_VERSION = 1


class SessionError(Exception):
    pass


def new_session_name() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


@dataclass
class Session:
    name: str
    messages: list[Message] = field(default_factory=list)
    cwd: str = ""
    model: str = ""
    usage: Usage = field(default_factory=Usage)  # of the last response
    num_compactions: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "name": self.name,
            "cwd": self.cwd,
            "model": self.model,
            "usage": vars(self.usage),
            "num_compactions": self.num_compactions,
            "messages": [m.to_json() for m in self.messages],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Session:
        if data.get("version") != FORMAT_VERSION:
            raise SessionError(f"unsupported session format {data.get('version')!r}")
        return cls(
            data["name"],
            [Message.from_json(m) for m in data["messages"]],
            data.get("cwd", ""),
            data.get("model", ""),
            Usage(**data.get("usage", {})),
            data.get("num_compactions", 0),
        )


class SessionStore:
    def __init__(self, root: Path):
        self.root = root

    def path(self, name: str) -> Path:
        if not _NAME.match(name):
            raise SessionError(f"invalid session name {name!r}: use letters, digits, '.', '_' and '-'")
        return self.root / f"{name}.json"

    def save(self, session: Session) -> Path:
        from kvserve.agent.tools.editing import write_atomic

        path = self.path(session.name)
        self.root.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(session.to_json(), ensure_ascii=False, indent=1).encode("utf-8"))
        return path

    def load(self, name: str) -> Session:
        path = self.path(name)
        if not path.exists():
            raise SessionError(f"no session named {name!r} in {self.root}")
        try:
            return Session.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, KeyError, TypeError) as error:
            raise SessionError(f"session {name!r} is unreadable: {error}") from None

    def exists(self, name: str) -> bool:
        return self.path(name).exists()

    def names(self) -> list[str]:
        """Session names, most recently saved first."""
        if not self.root.is_dir():
            return []
        files = sorted(self.root.glob("*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        return [p.stem for p in files]

    def last(self) -> str | None:
        names = self.names()
        return names[0] if names else None
