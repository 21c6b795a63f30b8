"""SharedIndex: one replica's picture of the shared tier, in memory, and how it is refreshed (pure).

The shared store has no index of its own: a database over a network filesystem or a bucket is
exactly what several hosts cannot share safely. Each replica lists the manifests instead and keeps
what they say (text key, chunk spans) here. A manifest is written after all its chunks, so a chunk
the index knows is in the store, unless a sweeper removed it since (a load then misses: the request
prefills). Refreshing is a diff of the listing against what is known (`plan_refresh`), run when a
lookup misses and every `interval_s` (`RefreshSchedule`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from kvserve.kvstore.checkpoint import ChunkSpan, TextKey
from kvserve.kvstore.manifest import Manifest
from kvserve.kvstore.shared.keys import parse_key
from kvserve.kvstore.shared.object_store import ObjectInfo


class ObjectStamp(NamedTuple):
    """What identifies one version of an object in a listing: a manifest deleted and written
    again (by another replica, after a sweep) has another stamp and is read again."""

    size: int
    modified: float


@dataclass(frozen=True)
class SharedEntry:
    checkpoint_id: str
    text: TextKey
    num_tokens: int
    created: float
    chunks: tuple[ChunkSpan, ...]
    stamp: ObjectStamp

    @classmethod
    def of(cls, manifest: Manifest, stamp: ObjectStamp) -> SharedEntry:
        meta = manifest.meta
        return cls(
            meta.checkpoint_id, meta.text, meta.num_tokens, meta.created, tuple(manifest.chunks), stamp
        )


class SharedIndex:
    """Checkpoints of one model in the shared store, with their chunks. Not thread-safe (the tier locks)."""

    def __init__(self) -> None:
        self._entries: dict[str, SharedEntry] = {}
        self._spans: dict[str, ChunkSpan] = {}  # chunk key -> its span
        self._users: dict[str, set[str]] = {}  # chunk key -> checkpoint ids using it

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, checkpoint_id: object) -> bool:
        return checkpoint_id in self._entries

    def get(self, checkpoint_id: str) -> SharedEntry | None:
        return self._entries.get(checkpoint_id)

    def stamps(self) -> dict[str, ObjectStamp]:
        return {checkpoint_id: entry.stamp for checkpoint_id, entry in self._entries.items()}

    def add(self, entry: SharedEntry) -> None:
        self.remove(entry.checkpoint_id)
        self._entries[entry.checkpoint_id] = entry
        for span in entry.chunks:
            self._spans[span.key] = span
            self._users.setdefault(span.key, set()).add(entry.checkpoint_id)

    def remove(self, checkpoint_id: str) -> SharedEntry | None:
        entry = self._entries.pop(checkpoint_id, None)
        if entry is not None:
            for span in entry.chunks:
                users = self._users.get(span.key)
                if users is not None:
                    users.discard(checkpoint_id)
                    if not users:
                        del self._users[span.key]
                        del self._spans[span.key]
        return entry

    def has_chunk(self, key: str) -> bool:
        return key in self._spans

    def stored_spans(self, spans: Iterable[ChunkSpan]) -> set[ChunkSpan]:
        """The given spans that a known checkpoint uses (the same key *and* extent)."""
        return {span for span in spans if self._spans.get(span.key) == span}

    def users_of(self, chunk_key: str) -> list[str]:
        return sorted(self._users.get(chunk_key, ()))

    def text_candidates(self, max_text_bytes: int) -> list[TextKey]:
        return [e.text for e in self._entries.values() if e.text.num_bytes <= max_text_bytes]


class RefreshPlan(NamedTuple):
    fetch: tuple[tuple[str, ObjectStamp], ...]  # manifests to read (new, or written again)
    drop: tuple[str, ...]  # known checkpoints whose manifest is gone


def plan_refresh(
    model: str,
    listing: Iterable[ObjectInfo],
    known: Mapping[str, ObjectStamp],
    skipped: Mapping[str, ObjectStamp],
) -> RefreshPlan:
    """What to read and forget after listing `<model>/checkpoints/`. `skipped` holds manifests
    read before and found unusable (another format version): not read again while unchanged."""
    listed: dict[str, ObjectStamp] = {}
    for info in listing:
        parsed = parse_key(info.key)
        if parsed is not None and parsed.kind == "manifest" and parsed.model == model:
            listed[parsed.name] = ObjectStamp(info.size, info.modified)
    fetch = tuple(
        (checkpoint_id, stamp)
        for checkpoint_id, stamp in sorted(listed.items())
        if known.get(checkpoint_id) != stamp and skipped.get(checkpoint_id) != stamp
    )
    drop = tuple(sorted(checkpoint_id for checkpoint_id in known if checkpoint_id not in listed))
    return RefreshPlan(fetch, drop)


@dataclass
class RefreshSchedule:
    """When to list the store again: every `interval_s`, and on a lookup that missed what the
    index knows (another replica may have just written it) at most every `miss_interval_s`, so
    a burst of cold prompts lists once, not once per request."""

    interval_s: float
    miss_interval_s: float
    last: float = field(default=float("-inf"))

    def due(self, now: float, *, miss: bool = False) -> bool:
        return now - self.last >= (self.miss_interval_s if miss else self.interval_s)

    def done(self, now: float) -> None:
        self.last = now
