"""A small key reader for the TUI: a thread that reads the terminal in cbreak mode and queues
key names ("p", "q", "up", "down", "enter"); the terminal mode is restored on exit."""

from __future__ import annotations

import contextlib
import os
import queue
import select
import sys
import termios
import threading
import tty
from collections.abc import Iterator

_ESCAPES = {"\x1b[A": "up", "\x1b[B": "down", "\x1bOA": "up", "\x1bOB": "down"}


def key_name(chunk: str) -> str | None:
    """The key a chunk of terminal input stands for, or None for keys the TUI ignores."""
    if chunk in _ESCAPES:
        return _ESCAPES[chunk]
    if chunk in ("\r", "\n"):
        return "enter"
    if chunk in ("k", "j"):  # vi keys, for terminals whose arrows do not come through
        return "up" if chunk == "k" else "down"
    return chunk.lower() if len(chunk) == 1 and chunk.isprintable() else None


@contextlib.contextmanager
def key_reader() -> Iterator[queue.Queue[str]]:
    """Yields a queue of key names read from stdin until the block exits."""
    keys: queue.Queue[str] = queue.Queue()
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                chunk = os.read(fd, 16).decode("utf-8", "replace")
                if (name := key_name(chunk)) is not None:
                    keys.put(name)

    tty.setcbreak(fd)
    thread = threading.Thread(target=read, name="kvserve-eval-keys", daemon=True)
    thread.start()
    try:
        yield keys
    finally:
        stop.set()
        thread.join(1)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
