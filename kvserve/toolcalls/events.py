"""What a tool-call parser emits. Plain dataclasses: the serving layer maps them to its own
GenerationEvents (adding call ids), so this package stays free of protocol and serving types."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TextChunk:
    """Visible text that is not part of any tool call."""

    text: str


@dataclass(frozen=True, slots=True)
class CallStart:
    """A call's name is known. `index` counts calls in this output from 0."""

    index: int
    name: str


@dataclass(frozen=True, slots=True)
class CallArgs:
    """A fragment of the call's arguments JSON; the fragments of one call concatenate to `CallEnd.arguments`."""

    index: int
    fragment: str


@dataclass(frozen=True, slots=True)
class CallEnd:
    """The call is complete. `arguments` is compact JSON (an object); `raw` is the exact sampled markup of
    the block holding the call (whitespace sampled before it included), which tool replay memory stores
    so a replayed call renders byte-identically. Calls of one block share the same `raw`."""

    index: int
    arguments: str
    raw: str
    block: int = 0  # which block of the output holds the call (0, 1, ...), so equal `raw`s stay apart
    # The call started streaming live, then its block turned out malformed: `arguments` is what was sent,
    # closed into valid JSON, and the block's markup follows as text (stream.py `_abort_live`).
    aborted: bool = False


ToolEvent = TextChunk | CallStart | CallArgs | CallEnd
