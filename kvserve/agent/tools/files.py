"""Read-only file tools: `read` (bounded, by line range), `more` (continues exactly where the last
read stopped) and `list`."""

from __future__ import annotations

import itertools
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from kvserve.agent.tools.base import Args, Tool, ToolContext, integer, schema, string
from kvserve.agent.tools.ledger import FileLedger
from kvserve.agent.workspace import ToolError

MAX_LINES = 2000
MAX_READ_BYTES = 64 << 10  # one read returns at most this much text
MAX_LINE_CHARS = 2000
MAX_LIST_ENTRIES = 300
BINARY_SNIFF_BYTES = 8192


@dataclass(frozen=True)
class ReadCursor:
    path: Path
    next_line: int  # 1-based line `more` starts at


def is_binary(path: Path) -> bool:
    with open(path, "rb") as f:
        return b"\0" in f.read(BINARY_SNIFF_BYTES)


class FileReader:
    """`read` and `more` share the cursor; `read` records what it saw in the ledger."""

    def __init__(self, ctx: ToolContext, ledger: FileLedger):
        self.ctx = ctx
        self.ledger = ledger
        self.cursor: ReadCursor | None = None

    def read(self, args: Args) -> str:
        path = self.ctx.workspace.resolve(args.text("path"))
        start = args.integer("start_line", 1, 1, 1 << 40)
        count = args.integer("max_lines", 500, 1, MAX_LINES)
        check_regular_file(path, args.values["path"])
        if is_binary(path):
            size = path.stat().st_size
            raise ToolError(f"{args.values['path']}: binary file ({size} bytes), not shown")
        self.ledger.record(path)
        return self._lines(path, start, count)

    def more(self, args: Args) -> str:
        count = args.integer("count", 500, 1, MAX_LINES)
        if self.cursor is None:
            raise ToolError("more: nothing to continue; call read first")
        if not self.cursor.path.is_file():
            raise ToolError(f"more: {self.ctx.workspace.display(self.cursor.path)} no longer exists")
        return self._lines(self.cursor.path, self.cursor.next_line, count)

    def _lines(self, path: Path, start: int, count: int) -> str:
        shown, num_bytes, line_no, has_more = [], 0, start, False
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            for line_no, line in enumerate(itertools.islice(f, start - 1, None), start):
                if len(shown) == count or num_bytes >= MAX_READ_BYTES:
                    has_more = True
                    break
                text = line.rstrip("\r\n")
                if len(text) > MAX_LINE_CHARS:
                    text = text[:MAX_LINE_CHARS] + f" … [line truncated, {len(text)} chars]"
                shown.append(f"{line_no:6}\t{text}")
                num_bytes += len(text) + 8
        name = self.ctx.workspace.display(path)
        if not shown:
            self.cursor = None
            return f"{name}: no lines at or after line {start} (end of file)"
        end = start + len(shown) - 1
        self.cursor = ReadCursor(path, end + 1) if has_more else None
        tail = (
            f"[more lines follow from line {end + 1}; call more to continue]" if has_more else "[end of file]"
        )
        return f"{name}: lines {start}-{end}\n" + "\n".join(shown) + "\n" + tail

    def list(self, args: Args) -> str:
        path = self.ctx.workspace.resolve(args.text("path", "."))
        if not path.exists():
            raise ToolError(f"{args.values.get('path', '.')}: no such file or directory")
        if not path.is_dir():
            raise ToolError(f"{args.values.get('path', '.')}: not a directory")
        entries = sorted(os.scandir(path), key=lambda e: e.name)
        lines = [_entry_line(e) for e in entries[:MAX_LIST_ENTRIES]]
        if len(entries) > MAX_LIST_ENTRIES:
            lines.append(f"… {len(entries) - MAX_LIST_ENTRIES} more entries not shown")
        header = f"{self.ctx.workspace.display(path)}: {len(entries)} entries"
        return "\n".join([header, *lines])


def check_regular_file(path: Path, shown: str) -> None:
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise ToolError(f"{shown}: no such file") from None
    if stat.S_ISDIR(mode):
        raise ToolError(f"{shown}: is a directory; use list")
    if not stat.S_ISREG(mode):
        raise ToolError(f"{shown}: not a regular file")


def _entry_line(entry: os.DirEntry) -> str:
    if entry.is_dir():
        return f"{entry.name}/"
    if entry.is_symlink():
        return f"{entry.name}@"
    try:
        return f"{entry.name}  ({entry.stat().st_size} bytes)"
    except OSError:
        return entry.name


def file_tools(reader: FileReader) -> list[Tool]:
    return [
        Tool(
            "read",
            "Read a text file with line numbers, at most max_lines lines from start_line. "
            "If the output ends with 'more lines follow', call more to continue.",
            schema(
                {
                    "path": string("file path, relative to the working directory"),
                    "start_line": integer("first line to show, 1-based (default 1)"),
                    "max_lines": integer(f"lines to show (default 500, at most {MAX_LINES})"),
                },
                ("path",),
            ),
            reader.read,
            summary_field="path",
        ),
        Tool(
            "more",
            "Continue the last read exactly where it stopped.",
            schema({"count": integer("lines to show (default 500)")}),
            reader.more,
        ),
        Tool(
            "list",
            f"List a directory (at most {MAX_LIST_ENTRIES} entries; directories end with /).",
            schema({"path": string("directory (default: the working directory)")}),
            reader.list,
            summary_field="path",
        ),
    ]
