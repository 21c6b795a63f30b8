"""Feeding helpers shared by the streaming-parser tests: run a parser over chunks, merge adjacent
text/argument fragments, and assert that every way of chunking an input gives the same events."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol


class Streaming(Protocol):
    def feed(self, text: str) -> list[Any]: ...

    def finish(self) -> list[Any]: ...


_MERGED_FIELDS = ("text", "fragment")


def run(make: Callable[[], Streaming], chunks: Iterable[str]) -> list[Any]:
    parser = make()
    events: list[Any] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    return events + parser.finish()


def merged(events: Sequence[Any]) -> list[Any]:
    """Adjacent events of one type (and one call index) with a text/fragment field become one.

    How arguments are fragmented depends on the chunking, so fragments merge. A call that started
    streaming live and then was aborted (its block malformed: CallEnd.aborted) exists only under some
    chunkings; its block comes back as text either way, so it is dropped here."""
    aborted = {e.index for e in events if getattr(e, "aborted", False)}
    out: list[Any] = []
    for event in events:
        index = getattr(event, "index", None)
        if index is not None:
            if index in aborted:
                continue
            event = dataclasses.replace(event, index=index - sum(i < index for i in aborted))
        prev = out[-1] if out else None
        field = next((f for f in _MERGED_FIELDS if hasattr(event, f)), None)
        if (
            field is not None
            and type(prev) is type(event)
            and getattr(prev, "index", None) == getattr(event, "index", None)
        ):
            out[-1] = dataclasses.replace(prev, **{field: getattr(prev, field) + getattr(event, field)})
        else:
            out.append(event)
    return out


def splits(text: str) -> Iterable[list[str]]:
    """Whole, every 2-way split, and 1-char chunks."""
    yield [text]
    for i in range(len(text) + 1):
        yield [text[:i], text[i:]]
    yield list(text)


def assert_split_invariant(make: Callable[[], Streaming], text: str) -> list[Any]:
    """Every chunking of `text` gives the same merged events; returns them."""
    expected = merged(run(make, [text]))
    for chunks in splits(text):
        events = run(make, chunks)
        assert merged(events) == expected, f"chunks {chunks!r}"
        assert_no_empty_deltas(events)
        assert_fragments_concatenate(events)
    return expected


def assert_no_empty_deltas(events: Iterable[Any]) -> None:
    """An empty delta would reach an encoder as an empty SSE chunk."""
    for event in events:
        for field in _MERGED_FIELDS:
            assert getattr(event, field, "x") != "", event


def assert_fragments_concatenate(events: Iterable[Any]) -> None:
    """However a call's arguments were fragmented, the fragments add up to its final arguments."""
    sent: dict[int, str] = {}
    for event in events:
        if hasattr(event, "fragment"):
            sent[event.index] = sent.get(event.index, "") + event.fragment
        elif hasattr(event, "arguments"):
            assert sent.get(event.index, "") == event.arguments, event
