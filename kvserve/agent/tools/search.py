"""`search`: a small ripgrep in Python (regex or literal, glob filter, context lines), bounded in
results and output, skipping binary files, huge files and the usual build/VCS directories."""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterator
from pathlib import Path

from kvserve.agent.tools.base import Args, Tool, ToolContext, boolean, integer, schema, string
from kvserve.agent.tools.files import is_binary
from kvserve.agent.workspace import ToolError

SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "node_modules",
        "__pycache__",
        ".venv",
        "venv",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
    }
)
MAX_FILE_BYTES = 4 << 20
MAX_OUTPUT_CHARS = 32 << 10
MAX_LINE_CHARS = 300


class Searcher:
    def __init__(self, ctx: ToolContext):
        self.ctx = ctx

    def search(self, args: Args) -> str:
        query = args.text("query")
        root = self.ctx.workspace.resolve(args.text("path", "."))
        mode = args.choice("mode", "regex", ("regex", "literal"))
        glob = args.values.get("glob")
        if glob is not None and not isinstance(glob, str):
            raise ToolError("search: 'glob' must be a string")
        context = args.integer("context", 0, 0, 5)
        max_results = args.integer("max_results", 50, 1, 500)
        flags = 0 if args.flag("case_sensitive", True) else re.IGNORECASE
        try:
            pattern = re.compile(re.escape(query) if mode == "literal" else query, flags)
        except re.error as error:
            raise ToolError(f"search: invalid regex: {error}; set mode to literal for plain text") from None
        if not root.exists():
            raise ToolError(f"{args.values.get('path', '.')}: no such file or directory")
        return self._run(root, pattern, glob, context, max_results)

    def _run(
        self, root: Path, pattern: re.Pattern[str], glob: str | None, context: int, max_results: int
    ) -> str:
        out: list[str] = []
        num_matches, num_chars, is_truncated = 0, 0, False
        for path in _files(root, glob):
            if self.ctx.cancel.is_set():
                out.append("[search interrupted]")
                break
            for block in _file_matches(
                path, pattern, context, max_results - num_matches, self.ctx.workspace.display(path)
            ):
                num_matches += 1  # one block per matching line
                out.append(block)
                num_chars += len(block)
            if num_matches >= max_results or num_chars >= MAX_OUTPUT_CHARS:
                is_truncated = True
                break
        if not out:
            return "no matches"
        text = "\n".join(out)[:MAX_OUTPUT_CHARS]
        return text + ("\n[results truncated; narrow the search]" if is_truncated else "")


def _files(root: Path, glob: str | None) -> Iterator[Path]:
    if root.is_file():
        yield root
        return
    for directory, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(names):
            if glob and not (
                fnmatch.fnmatch(name, glob) or fnmatch.fnmatch(os.path.join(directory, name), glob)
            ):
                continue
            path = Path(directory) / name
            try:
                if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES or is_binary(path):
                    continue
            except OSError:
                continue
            yield path


def _file_matches(
    path: Path, pattern: re.Pattern[str], context: int, budget: int, shown: str
) -> Iterator[str]:
    """One block per match: `path:line:text`, context lines as `path-line-text`."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return
    for i, line in enumerate(lines):
        if budget <= 0:
            return
        if not pattern.search(line):
            continue
        budget -= 1
        lo, hi = max(0, i - context), min(len(lines), i + context + 1)
        block = [
            f"{shown}{':' if j == i else '-'}{j + 1}{':' if j == i else '-'}{lines[j][:MAX_LINE_CHARS]}"
            for j in range(lo, hi)
        ]
        yield "\n".join(block)


def search_tools(searcher: Searcher) -> list[Tool]:
    return [
        Tool(
            "search",
            "Search file contents under a path (like ripgrep): matching lines as path:line:text.",
            schema(
                {
                    "query": string("regex (or literal text with mode=literal)"),
                    "path": string("file or directory to search (default: the working directory)"),
                    "mode": string("regex (default) or literal"),
                    "glob": string("only files whose name matches this glob, e.g. *.py"),
                    "context": integer("lines of context around each match, 0-5 (default 0)"),
                    "max_results": integer("most matches to return, 1-500 (default 50)"),
                    "case_sensitive": boolean("default true"),
                },
                ("query",),
            ),
            searcher.search,
            summary_field="query",
        )
    ]
