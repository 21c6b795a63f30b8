"""Stop strings over streamed text, with hold-back: a partial stop string is never emitted.

Semantics are those of checking after every character: generation stops at the first
position where any stop string ends (ties: the one that starts earliest), and the text
before that stop string is the output. Because the result does not depend on how the
text was chunked, every split of a stream gives the same output (tested that way).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple


class StopResult(NamedTuple):
    emit: str  # text now safe to show
    stopped: bool  # a stop string matched; nothing more will be emitted


class StopMatcher:
    def __init__(self, stop: Iterable[str] = ()):
        self.stop = tuple(s for s in dict.fromkeys(stop) if s)  # empty strings never match
        self._held = ""
        self.is_stopped = False
        self.matched: str | None = None  # the stop string that fired

    def feed(self, text: str) -> StopResult:
        if self.is_stopped:
            return StopResult("", True)
        if not self.stop:
            return StopResult(text, False)
        buffer = self._held + text
        match = self._first_match(buffer)
        if match is not None:
            start, stop = match
            self.is_stopped, self.matched, self._held = True, stop, ""
            return StopResult(buffer[:start], True)
        keep = self._partial_suffix_len(buffer)
        self._held = buffer[len(buffer) - keep :]
        return StopResult(buffer[: len(buffer) - keep], False)

    def finish(self) -> str:
        """End of generation without a match: the held text was not a stop string after all."""
        held, self._held = self._held, ""
        return "" if self.is_stopped else held

    def _first_match(self, buffer: str) -> tuple[int, str] | None:
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for stop in self.stop:
            start = buffer.find(stop)
            if start < 0:
                continue
            key = (start + len(stop), start, stop)
            if best is None or key[:2] < best[:2]:
                best = key
        return None if best is None else (best[1], best[2])

    def _partial_suffix_len(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of a stop string."""
        longest = min(len(buffer), max(len(s) for s in self.stop) - 1)
        for size in range(longest, 0, -1):
            suffix = buffer[-size:]
            if any(s.startswith(suffix) for s in self.stop):
                return size
        return 0
