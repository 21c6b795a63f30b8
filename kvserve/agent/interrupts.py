"""Ctrl+C as a cooperative cancel: the first SIGINT sets the turn's cancel event (the generation or
tool in flight stops, the session stays consistent); a second one while it is still set quits."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def cancel_on_sigint(cancel: threading.Event) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only (tests drive the loop from elsewhere)
        return

    def handler(signum: int, frame: object) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
