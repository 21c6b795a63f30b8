"""The one streaming state machine shared by every tool-call syntax.

It finds blocks between a syntax's start and end markers, holds back text that could be the start of a
marker (so a half-streamed `<tool_ca` is never shown as text), and hands each complete block to the
syntax's `parse_tool_call`. What the parse rejects is returned as text, so no output is ever lost or
raises. Whitespace between a call and its neighbours is a separator, not content.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from kvserve.toolcalls.events import CallArgs, CallEnd, CallStart, TextChunk, ToolEvent
from kvserve.toolcalls.live import LiveView, closed_arguments
from kvserve.toolcalls.syntax import (
    JSON_ERRORS,
    NeedsMore,
    ParamSchemas,
    ParsedCall,
    ParseResult,
    ToolLike,
    compact_json,
    param_schemas,
)

_EAGER_LIVE_CHARS = 512


class ToolSyntax(Protocol):
    """The three-symbol contract of a syntax module (see syntax.py)."""

    tool_call_start: str | tuple[str, ...]
    tool_call_end: str | tuple[str, ...] | None

    def parse_tool_call(self, block: str, tools: ParamSchemas, is_truncated: bool) -> ParseResult: ...


def _as_tuple(markers: str | tuple[str, ...]) -> tuple[str, ...]:
    return (markers,) if isinstance(markers, str) else markers


class ToolCallParser:
    """`feed(text)` per generated piece, `finish()` once; both return ToolEvents."""

    def __init__(self, syntax: ToolSyntax, tools: Iterable[ToolLike] = ()):
        self._syntax = syntax
        self._schemas = param_schemas(tools)
        self._starts = _as_tuple(syntax.tool_call_start)
        self._ends = None if syntax.tool_call_end is None else _as_tuple(syntax.tool_call_end)
        assert self._ends is None or len(self._ends) == len(self._starts)
        self._buf = ""  # text not yet emitted: a held partial marker, or the open block
        self._ws = ""  # whitespace held before `_buf`: dropped if a call follows it
        self._block: int | None = None  # index of the start marker of the open block
        self._block_ws = ""  # the whitespace that preceded the open block
        self._search_from = 0  # where to look for the open block's end marker next
        # Pieces of an open block not yet joined into `_buf`: joining on every token would copy the
        # block each time (quadratic in a long `write` call); only a piece that may hold the end marker
        # triggers the join. `_tail` is the block's last len(end) - 1 characters, for markers split
        # across pieces.
        self._parts: list[str] = []
        self._tail = ""
        self._after_call = False
        # Live streaming of the open block's first call (syntaxes with `live_call`): its index once
        # CallStart went out, the arguments prefix sent, and how much text arrived since the last look
        # (looking re-parses the block: past _EAGER_LIVE_CHARS it is done after every 1/32 growth of
        # the block, so a long block costs linear time overall).
        self._live_call = getattr(syntax, "live_call", None)
        self._live: tuple[int, str] | None = None
        self._unseen = 0
        self._seen = 0
        self.num_calls = 0
        self.num_blocks = 0  # blocks that parsed into calls

    def feed(self, text: str) -> list[ToolEvent]:
        events: list[ToolEvent] = []
        if self._block is not None and not self._may_close(text):
            self._parts.append(text)
            self._unseen += len(text)
            if self._live_call is not None and (
                self._seen <= _EAGER_LIVE_CHARS or self._unseen * 32 >= self._seen
            ):
                self._join("")
                self._stream_live(events)
            return events
        self._join(text)
        while self._buf:
            if self._block is not None:
                if not self._scan_block(events):
                    break
            elif not self._scan_text(events):
                break
        if self._block is not None:
            if self._ends is not None:
                self._tail = self._buf[-(len(self._ends[self._block]) - 1) :]
            self._stream_live(events)
        return events

    def finish(self) -> list[ToolEvent]:
        events: list[ToolEvent] = []
        if self._block is not None:
            # No end marker: cut by max_tokens (repair it) or a syntax whose calls run to the end.
            self._join("")
            block, self._buf = self._buf, ""
            result = self._syntax.parse_tool_call(block, self._schemas, self._ends is not None)
            self._close_block(block, None if isinstance(result, NeedsMore) else result, events)
        else:
            self._text(self._buf, events)
            self._buf = ""
        if self._ws and not self._after_call:
            events.append(TextChunk(self._ws))
        self._ws = ""
        return events

    # -- text outside blocks -------------------------------------------------------------

    def _scan_text(self, events: list[ToolEvent]) -> bool:
        """Emit text up to the next start marker and open the block; False when none is there yet."""
        found = [(pos, k) for k, start in enumerate(self._starts) if (pos := self._buf.find(start)) >= 0]
        if not found:
            keep = self._partial_marker_len()
            self._text(self._buf[: len(self._buf) - keep], events)
            self._buf = self._buf[len(self._buf) - keep :]
            return False
        pos, k = min(found)
        self._text(self._buf[:pos], events)
        self._block, self._block_ws, self._ws = k, self._ws, ""
        self._buf = self._buf[pos:]
        self._search_from = len(self._starts[k])
        return True

    def _partial_marker_len(self) -> int:
        """Length of the longest tail of the buffer that is a proper prefix of a start marker."""
        best = 0
        for start in self._starts:
            for n in range(min(len(start) - 1, len(self._buf)), best, -1):
                if self._buf.endswith(start[:n]):
                    best = n
                    break
        return best

    def _text(self, text: str, events: list[ToolEvent]) -> None:
        if not text:
            return
        full = self._ws + text
        body = full.rstrip()
        self._ws = full[len(body) :]
        if not body:
            return
        if self._after_call:
            body = body.lstrip()  # the separator after a call is not content
            self._after_call = False
        if body:
            events.append(TextChunk(body))

    # -- inside a block ------------------------------------------------------------------

    def _may_close(self, text: str) -> bool:
        """Whether `text` may complete the open block's end marker (never, for a syntax without one)."""
        if self._ends is None:
            return False
        end = self._ends[self._block or 0]
        window = self._tail + text
        self._tail = window[-(len(end) - 1) :]
        return end in window

    def _join(self, text: str) -> None:
        self._buf = "".join([self._buf, *self._parts, text])
        self._parts.clear()

    def _scan_block(self, events: list[ToolEvent]) -> bool:
        """Close the block at the first end marker that parses; False while none has arrived."""
        assert self._block is not None
        if self._ends is None:
            return False
        end = self._ends[self._block]
        while (pos := self._buf.find(end, self._search_from)) >= 0:
            stop = pos + len(end)
            result = self._syntax.parse_tool_call(self._buf[:stop], self._schemas, False)
            if isinstance(result, NeedsMore):  # the marker was inside a value: read on
                self._search_from = stop
                continue
            block, self._buf = self._buf[:stop], self._buf[stop:]
            self._close_block(block, result, events)
            return True
        self._search_from = max(self._search_from, len(self._buf) - len(end) + 1)
        return False

    def _stream_live(self, events: list[ToolEvent]) -> None:
        """Send what became certain of the open block's first call (its start, then argument text)."""
        self._seen, self._unseen = len(self._buf), 0
        if self._live_call is None:
            return
        view: LiveView | None = self._live_call(self._buf, self._schemas)
        if view is None:
            return
        if self._live is None:
            self._live = (self.num_calls, "")
            events.append(CallStart(self.num_calls, view.name))
        index, sent = self._live
        if len(view.arguments) > len(sent) and view.arguments.startswith(sent):
            events.append(CallArgs(index, view.arguments[len(sent) :]))
            self._live = (index, view.arguments)

    def _close_block(self, block: str, calls: list[ParsedCall] | None, events: list[ToolEvent]) -> None:
        self._block = None
        live, self._live = self._live, None
        self._seen = self._unseen = 0
        arguments = _serialized(calls)
        raw = self._block_ws + block
        if arguments is None:  # malformed: the model's text, exactly as sampled
            if live is not None:
                self._abort_live(live, raw, events)
            self._ws, self._block_ws = self._block_ws, ""
            self._text(block, events)
            return
        self._block_ws = ""
        for i, (call, text) in enumerate(zip(calls or (), arguments, strict=True)):
            index = self.num_calls
            self.num_calls += 1
            sent = ""
            if i == 0 and live is not None:
                sent = live[1] if text.startswith(live[1]) else text  # (a repeated key: see live.py)
            else:
                events.append(CallStart(index, call.name))
            if len(text) > len(sent):
                events.append(CallArgs(index, text[len(sent) :]))
            events.append(CallEnd(index, text, raw, self.num_blocks))
        self.num_blocks += 1
        self._after_call = True

    def _abort_live(self, live: tuple[int, str], raw: str, events: list[ToolEvent]) -> None:
        """A block that went malformed after its first call started streaming. The call cannot be taken
        back, so it ends with the arguments sent so far closed into valid JSON (marked `aborted`); the
        block itself then comes back as text, as every malformed block does, so nothing is lost."""
        index, sent = live
        final = closed_arguments(sent) or "{}"  # (always closes: sent is a compact prefix we wrote)
        if len(final) > len(sent) and final.startswith(sent):
            events.append(CallArgs(index, final[len(sent) :]))
        events.append(CallEnd(index, final, raw, self.num_blocks, aborted=True))
        self.num_calls += 1
        self.num_blocks += 1


def _serialized(calls: list[ParsedCall] | None) -> list[str] | None:
    """Each call's arguments as compact JSON; None when there are no calls (or absurdly deep values)."""
    if not calls:
        return None
    try:
        return [compact_json(call.arguments) for call in calls]
    except JSON_ERRORS:
        return None
