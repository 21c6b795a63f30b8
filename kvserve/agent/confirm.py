"""Confirmation of side-effecting tool calls: `--yes` and `--allow TOOL` pre-approve, anything else
asks a timed yes/no question that denies by default when nobody answers in time."""

from __future__ import annotations

import os
import select
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

DEFAULT_TIMEOUT_S = 10.0

# Asks one question ("allow bash ls?"), returns the answer; the UI decides how to ask.
Confirmer = Callable[[str], bool]


@dataclass(frozen=True)
class ConfirmPolicy:
    is_yes_to_all: bool = False
    allowed_tools: frozenset[str] = frozenset()

    def is_preapproved(self, tool_name: str) -> bool:
        return self.is_yes_to_all or tool_name in self.allowed_tools


class TimedPrompt:
    """A y/N question on a line-buffered input (a terminal in cooked mode, or a pipe): anything but
    y/yes is a no, and so are end of input, a cancel (Ctrl+C) and silence for `timeout_s`."""

    def __init__(
        self,
        stdin: TextIO | None = None,
        out: TextIO | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        cancel: threading.Event | None = None,
    ):
        self.stdin = stdin or sys.stdin
        self.out = out or sys.stderr
        self.timeout_s = timeout_s
        self.cancel = cancel or threading.Event()

    def __call__(self, question: str) -> bool:
        self.out.write(f"{question} [y/N] (no answer in {self.timeout_s:g}s = no) ")
        self.out.flush()
        answer = self._read_line()
        if answer is None:
            self.out.write("\n→ denied (no answer)\n")
            self.out.flush()
            return False
        return answer.strip().lower() in ("y", "yes")

    def _read_line(self) -> str | None:
        try:
            fd = self.stdin.fileno()
        except (OSError, ValueError):
            return None
        deadline = time.monotonic() + self.timeout_s
        pending = b""
        while not self.cancel.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], min(left, 0.1))
            if not ready:
                continue
            chunk = os.read(fd, 1024)
            if not chunk:
                return None  # end of input
            pending += chunk
            if b"\n" in pending or b"\r" in pending:
                return pending.decode("utf-8", "replace")
        return None
