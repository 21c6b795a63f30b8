"""Path confinement: every path a tool touches resolves inside the working directory, or inside
a directory the user allowed with `--allow-path`, else the tool call is refused."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class ToolError(Exception):
    """A tool call that cannot be carried out; the message goes back to the model verbatim."""


@dataclass(frozen=True)
class Workspace:
    root: Path
    allowed: tuple[Path, ...] = ()

    @classmethod
    def create(cls, root: str | Path, allowed: list[str] | tuple[str, ...] = ()) -> Workspace:
        return cls(Path(root).resolve(), tuple(Path(p).expanduser().resolve() for p in allowed))

    def resolve(self, path: str) -> Path:
        """`path` (relative to the root, or absolute) with symlinks resolved; refused if it escapes."""
        if not isinstance(path, str) or not path:
            raise ToolError("path must be a non-empty string")
        if "\0" in path:
            raise ToolError("path must not contain NUL bytes")
        candidate = (self.root / Path(path).expanduser()).resolve()
        if not any(candidate == base or base in candidate.parents for base in (self.root, *self.allowed)):
            raise ToolError(f"{path}: outside the working directory {self.root} (refused)")
        return candidate

    def display(self, path: Path) -> str:
        """A path as the model should see it: relative to the root when inside it."""
        try:
            return str(path.relative_to(self.root)) or "."
        except ValueError:
            return str(path)
