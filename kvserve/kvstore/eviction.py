"""Which checkpoints to delete so a new one fits the disk budget (pure, injected clock).

score = (effective_hits + 1) x tokens / marginal_bytes, lowest evicted first, where
effective_hits = hits x 2^(-age / half_life) (below 0.01 counts as 0) and marginal bytes
are what deleting the entry actually frees: its manifest plus the chunks no other
checkpoint (nor the incoming one) uses. Anchors (cold/evict/shutdown and the agent's
agent_system/agent_session) score x2; a `continued` or `agent_session` entry the incoming
checkpoint extends (an earlier state of the same sequence) scores x(0.05 + 0.45 h), h = eh/(eh+1).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from kvserve.kvstore.checkpoint import ANCHOR_REASONS, SUPERSEDED_REASONS, Checkpoint, SaveReason


@dataclass(frozen=True)
class EvictionPolicy:
    half_life_s: float = 6 * 3600.0
    min_effective_hits: float = 0.01
    anchor_factor: float = 2.0
    size_margin: float = 0.01  # a store must fit with 1% to spare


DEFAULT_EVICTION_POLICY = EvictionPolicy()


@dataclass(frozen=True)
class EvictionEntry:
    checkpoint_id: str
    reason: SaveReason
    num_tokens: int
    hits: int
    created: float
    last_used: float
    manifest_bytes: int
    chunk_keys: frozenset[str]
    is_protected: bool = False  # just loaded: the live sequence is built on it
    is_superseded: bool = False  # a continued/agent_session entry whose prefix the incoming store extends


@dataclass(frozen=True)
class IncomingStore:
    checkpoint_id: str
    num_bytes: int  # manifest + every chunk it uses: what must fit the budget on its own
    new_bytes: int  # manifest + the chunks not stored yet: what it adds to the total
    chunk_keys: frozenset[str]


def eviction_entries(
    checkpoints: Iterable[Checkpoint],
    now: float,
    loaded_at: Mapping[str, float],
    protect_loaded_s: float,
    incoming_num_tokens: int = 0,
    incoming_key_at: Callable[[int], str] | None = None,
) -> list[EvictionEntry]:
    """Entries for the stored checkpoints, flagged protected (loaded within `protect_loaded_s`)
    and superseded. `incoming_key_at(n)` is the key naming the incoming prefix's first n
    tokens: equal to a checkpoint's last chunk key iff the incoming prefix extends it."""
    entries = []
    for checkpoint in checkpoints:
        meta = checkpoint.meta
        superseded = (
            incoming_key_at is not None
            and meta.reason in SUPERSEDED_REASONS
            and meta.num_tokens < incoming_num_tokens
            and checkpoint.chunks[-1].key == incoming_key_at(meta.num_tokens)
        )
        loaded = loaded_at.get(checkpoint.checkpoint_id)
        entries.append(
            EvictionEntry(
                checkpoint.checkpoint_id,
                meta.reason,
                meta.num_tokens,
                meta.hits,
                meta.created,
                meta.last_used,
                checkpoint.manifest_bytes,
                frozenset(span.key for span in checkpoint.chunks),
                is_protected=loaded is not None and now - loaded < protect_loaded_s,
                is_superseded=superseded,
            )
        )
    return entries


class EvictionPlan(NamedTuple):
    outcome: Literal["fits", "too_large", "no_room"]
    victim_ids: tuple[str, ...]

    @property
    def can_store(self) -> bool:
        return self.outcome == "fits"


def effective_hits(hits: int, last_used: float, created: float, now: float, policy: EvictionPolicy) -> float:
    used_at = last_used or created
    if used_at <= 0 or hits <= 0:
        return 0.0
    decayed = hits * 2.0 ** (-max(0.0, now - used_at) / policy.half_life_s)
    return decayed if decayed >= policy.min_effective_hits else 0.0


def eviction_score(entry: EvictionEntry, marginal_bytes: int, now: float, policy: EvictionPolicy) -> float:
    eh = effective_hits(entry.hits, entry.last_used, entry.created, now, policy)
    score = (eh + 1.0) * entry.num_tokens / max(1, marginal_bytes)
    if entry.reason in ANCHOR_REASONS:
        score *= policy.anchor_factor
    if entry.is_superseded and entry.reason in SUPERSEDED_REASONS:
        score *= 0.05 + 0.45 * (eh / (eh + 1.0))
    return score


def marginal_bytes(entry: EvictionEntry, refcounts: Mapping[str, int], chunk_sizes: Mapping[str, int]) -> int:
    """Bytes freed by deleting `entry`: its manifest and the chunks only it references."""
    own = sum(chunk_sizes.get(key, 0) for key in entry.chunk_keys if refcounts[key] == 1)
    return entry.manifest_bytes + own


def fits_budget(num_bytes: int, budget_bytes: int, policy: EvictionPolicy) -> bool:
    return num_bytes + math.ceil(num_bytes * policy.size_margin) <= budget_bytes


def plan_eviction(
    entries: Sequence[EvictionEntry],
    chunk_sizes: Mapping[str, int],
    budget_bytes: int,
    now: float,
    incoming: IncomingStore | None = None,
    policy: EvictionPolicy = DEFAULT_EVICTION_POLICY,
) -> EvictionPlan:
    """Victims (in eviction order) that bring the total under budget with `incoming` added.

    Without `incoming` it just trims the store to its budget (at open, after a budget cut).
    When no set of evictable entries makes room, nothing is evicted and the store is skipped.
    """
    if incoming is not None and not fits_budget(incoming.num_bytes, budget_bytes, policy):
        return EvictionPlan("too_large", ())
    refcounts: Counter[str] = Counter()
    for entry in entries:
        refcounts.update(entry.chunk_keys)
    if incoming is not None:
        refcounts.update(incoming.chunk_keys)  # chunks it reuses stay, whoever else goes
    total = sum(entry.manifest_bytes for entry in entries) + sum(chunk_sizes.values())
    needed = incoming.new_bytes if incoming is not None else 0
    incoming_id = incoming.checkpoint_id if incoming is not None else None
    remaining = [e for e in entries if not e.is_protected and e.checkpoint_id != incoming_id]
    victims: list[str] = []
    while total + needed > budget_bytes:
        if not remaining:
            return EvictionPlan("no_room", ())
        scored = [
            (eviction_score(e, marginal_bytes(e, refcounts, chunk_sizes), now, policy), e.last_used, i)
            for i, e in enumerate(remaining)
        ]
        _, _, index = min(scored)
        victim = remaining.pop(index)
        total -= marginal_bytes(victim, refcounts, chunk_sizes)
        refcounts.subtract(victim.chunk_keys)
        victims.append(victim.checkpoint_id)
    return EvictionPlan("fits", tuple(victims))


class ScoredEntry(NamedTuple):
    entry: EvictionEntry
    marginal_bytes: int
    effective_hits: float
    score: float


def score_entries(
    entries: Sequence[EvictionEntry],
    chunk_sizes: Mapping[str, int],
    now: float,
    policy: EvictionPolicy = DEFAULT_EVICTION_POLICY,
) -> list[ScoredEntry]:
    """Every entry's marginal bytes and eviction score now, as `plan_eviction` would rank them
    before a store (for `kvserve serve`'s console: which checkpoint goes next, and why)."""
    refcounts: Counter[str] = Counter()
    for entry in entries:
        refcounts.update(entry.chunk_keys)
    scored = []
    for entry in entries:
        marginal = marginal_bytes(entry, refcounts, chunk_sizes)
        eh = effective_hits(entry.hits, entry.last_used, entry.created, now, policy)
        scored.append(ScoredEntry(entry, marginal, eh, eviction_score(entry, marginal, now, policy)))
    return scored
