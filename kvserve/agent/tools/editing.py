"""File-changing tools: `write` (atomic temp + rename; refuses to clobber a file that changed since
the agent read it) and `edit` (one exact, unique old → new replacement)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from kvserve.agent.tools.base import Args, Tool, ToolContext, boolean, schema, string
from kvserve.agent.tools.files import is_binary
from kvserve.agent.tools.ledger import FileLedger
from kvserve.agent.workspace import ToolError

MAX_WRITE_BYTES = 8 << 20


def write_atomic(path: Path, data: bytes) -> None:
    """Readers see the old file or the new one, never a torn one; the mode of a replaced file is kept."""
    mode = path.stat().st_mode & 0o7777 if path.exists() else None
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


class FileEditor:
    def __init__(self, ctx: ToolContext, ledger: FileLedger):
        self.ctx = ctx
        self.ledger = ledger

    def write(self, args: Args) -> str:
        shown = args.text("path")
        path = self.ctx.workspace.resolve(shown)
        content = args.text("content", allow_empty=True)
        data = content.encode("utf-8")
        if len(data) > MAX_WRITE_BYTES:
            raise ToolError(f"write: content is {len(data)} bytes; the limit is {MAX_WRITE_BYTES}")
        if path.is_dir():
            raise ToolError(f"{shown}: is a directory")
        refusal = self.ledger.check_unchanged(path)
        if refusal is not None:
            raise ToolError(f"write {shown}: refused: {refusal}")
        existed = path.exists()
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data)
        self.ledger.record(path)
        lines = content.count("\n") + (1 if content and not content.endswith("\n") else 0)
        return f"{'overwrote' if existed else 'created'} {shown} ({len(data)} bytes, {lines} lines)"

    def edit(self, args: Args) -> str:
        shown = args.text("path")
        path = self.ctx.workspace.resolve(shown)
        old = args.text("old")
        new = args.text("new", allow_empty=True)
        replace_all = args.flag("replace_all", False)
        if not path.is_file():
            raise ToolError(f"{shown}: no such file")
        if is_binary(path):
            raise ToolError(f"{shown}: binary file; edit works on text files only")
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"{shown}: not valid UTF-8; edit works on UTF-8 text only") from None
        starts = _occurrences(text, old)
        if not starts:
            hint = (
                " (it does match when whitespace is ignored; copy it exactly)"
                if _loose_match(text, old)
                else ""
            )
            raise ToolError(
                f"edit {shown}: old text not found{hint}; read the file and copy the text exactly"
            )
        if len(starts) > 1 and not replace_all:
            lines = ", ".join(str(text.count("\n", 0, s) + 1) for s in starts[:10])
            raise ToolError(
                f"edit {shown}: old text matches {len(starts)} times (at lines {lines}); "
                "include more surrounding lines to make it unique, or set replace_all"
            )
        updated = (
            text.replace(old, new) if replace_all else text[: starts[0]] + new + text[starts[0] + len(old) :]
        )
        write_atomic(path, updated.encode("utf-8"))
        self.ledger.record(path)
        first = text.count("\n", 0, starts[0]) + 1
        return f"edited {shown}: {len(starts) if replace_all else 1} replacement(s), first at line {first}"


def _occurrences(text: str, needle: str) -> list[int]:
    starts, at = [], text.find(needle)
    while at != -1:
        starts.append(at)
        at = text.find(needle, at + len(needle))
    return starts


def _loose_match(text: str, needle: str) -> bool:
    return " ".join(needle.split()) in " ".join(text.split())


def editing_tools(editor: FileEditor) -> list[Tool]:
    return [
        Tool(
            "write",
            "Create or overwrite a whole file (atomically). Overwriting needs a prior read of the file, "
            "and is refused if the file changed on disk since.",
            schema(
                {"path": string("file path"), "content": string("the complete new content")},
                ("path", "content"),
            ),
            editor.write,
            needs_confirmation=True,
            summary_field="path",
        ),
        Tool(
            "edit",
            "Replace one exact occurrence of old with new in a file. old must match exactly once "
            "(copy it from read, with enough context to be unique).",
            schema(
                {
                    "path": string("file path"),
                    "old": string("the exact text to replace"),
                    "new": string("the replacement text"),
                    "replace_all": boolean("replace every occurrence instead (default false)"),
                },
                ("path", "old", "new"),
            ),
            editor.edit,
            needs_confirmation=True,
            summary_field="path",
        ),
    ]
