"""Streaming split of generated text into reasoning and content.

The reasoning block is recognised only at the very start of the output (or already open, when the
prompt opened it); after its close tag everything is content, so a model that writes about `<think>`
tags in its answer is not cut. Partial tags are held back, never streamed. Unterminated reasoning
stays reasoning (a length cut inside the block must not leak thoughts into the answer).
"""

from __future__ import annotations

import enum

from kvserve.reasoning.events import ContentChunk, ReasoningChunk, SegmentEvent
from kvserve.reasoning.syntax import ReasoningSyntax


class _State(enum.Enum):
    START = enum.auto()  # nothing but whitespace seen: an open tag may still come
    REASONING = enum.auto()
    CONTENT = enum.auto()


class ReasoningSegmenter:
    """`feed(text)` per generated piece, `finish()` once; both return SegmentEvents."""

    def __init__(self, syntax: ReasoningSyntax, starts_in_reasoning: bool | None = None):
        self._open, self._close = syntax.open, syntax.close
        inside = syntax.opens_in_prompt if starts_in_reasoning is None else starts_in_reasoning
        self._state = _State.REASONING if inside else _State.START
        # A template that opened the block may still see the model write the open tag again.
        self._may_reopen = inside
        self._buf = ""
        self._trim_leading = True  # whitespace right after a tag is framing, not text
        self.is_reasoning_closed = False

    def feed(self, text: str) -> list[SegmentEvent]:
        self._buf += text
        events: list[SegmentEvent] = []
        while self._buf and self._step(events):
            pass
        return events

    def finish(self) -> list[SegmentEvent]:
        events: list[SegmentEvent] = []
        rest, self._buf = self._buf, ""
        if self._state is _State.REASONING:
            self._emit_reasoning(rest, events)
        elif self._state is _State.START:
            if rest:  # only whitespace or a partial open tag: it was text after all
                events.append(ContentChunk(rest))
        elif rest and (rest.strip() or not self._trim_leading):
            events.append(ContentChunk(rest.lstrip() if self._trim_leading else rest))
        return events

    def _step(self, events: list[SegmentEvent]) -> bool:
        """Consume what can be decided now; False when the rest must wait for more text."""
        if self._state is _State.START:
            return self._step_start()
        if self._state is _State.REASONING:
            return self._step_reasoning(events)
        if self._trim_leading:
            head = self._buf.lstrip()
            if not head:
                return False  # whitespace after the close tag: a separator unless text follows
            self._buf, self._trim_leading = head, False
        events.append(ContentChunk(self._buf))
        self._buf = ""
        return False

    def _step_start(self) -> bool:
        head = self._buf.lstrip()
        if head.startswith(self._open):
            self._buf = head[len(self._open) :]
            self._state = _State.REASONING
            return True
        if not head or self._open.startswith(head):
            return False  # whitespace or a partial open tag: wait
        self._state, self._trim_leading = _State.CONTENT, False  # no reasoning: content verbatim
        return True

    def _step_reasoning(self, events: list[SegmentEvent]) -> bool:
        if self._may_reopen:
            head = self._buf.lstrip()
            if not head or (self._open.startswith(head) and head != self._open):
                return False
            self._may_reopen = False
            if head.startswith(self._open):
                self._buf = head[len(self._open) :]
        at = self._buf.find(self._close)
        if at >= 0:
            self._emit_reasoning(self._buf[:at], events)
            self._buf = self._buf[at + len(self._close) :]
            self._state, self._trim_leading = _State.CONTENT, True
            self.is_reasoning_closed = True
            return True
        keep = _partial_len(self._buf, self._close)
        self._emit_reasoning(self._buf[: len(self._buf) - keep], events)
        self._buf = self._buf[len(self._buf) - keep :]
        return False

    def _emit_reasoning(self, text: str, events: list[SegmentEvent]) -> None:
        if self._trim_leading:
            text = text.lstrip()
            self._trim_leading = not text
        if text:
            events.append(ReasoningChunk(text))


def _partial_len(text: str, tag: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
