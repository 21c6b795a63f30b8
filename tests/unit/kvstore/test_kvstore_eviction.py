"""Eviction policy (pure, injected clock): one test per rule."""

from __future__ import annotations

import pytest

from kvserve.kvstore.eviction import (
    EvictionEntry,
    EvictionPolicy,
    IncomingStore,
    effective_hits,
    eviction_score,
    fits_budget,
    plan_eviction,
)

HOUR = 3600.0
NOW = 100 * HOUR
POLICY = EvictionPolicy()


def entry(checkpoint_id: str, chunks: str = "", **fields) -> EvictionEntry:
    """An entry of 1000 tokens; `chunks` names its chunks by letters (each 1000 bytes); by
    default it has one chunk of its own."""
    values = {
        "reason": "continued",
        "num_tokens": 1000,
        "hits": 0,
        "created": NOW - HOUR,
        "last_used": NOW - HOUR,
        "manifest_bytes": 0,
        "chunk_keys": frozenset(chunks) if chunks else frozenset({checkpoint_id}),
    }
    values.update(fields)
    return EvictionEntry(checkpoint_id, **values)


def sizes(entries: list[EvictionEntry]) -> dict[str, int]:
    keys = set().union(*(e.chunk_keys for e in entries))
    return {key: 1000 for key in keys}


def incoming(new_bytes: int = 1000, chunks: str = "z", num_bytes: int | None = None) -> IncomingStore:
    return IncomingStore(
        "new", num_bytes if num_bytes is not None else new_bytes, new_bytes, frozenset(chunks)
    )


def victims(entries: list[EvictionEntry], budget: int, store: IncomingStore | None = None) -> tuple[str, ...]:
    plan = plan_eviction(entries, sizes(entries), budget, NOW, store, POLICY)
    assert plan.can_store
    return plan.victim_ids


def test_effective_hits_halve_every_six_hours_and_vanish_below_a_hundredth() -> None:
    assert effective_hits(8, NOW, 0, NOW, POLICY) == 8
    assert effective_hits(8, NOW - 6 * HOUR, 0, NOW, POLICY) == pytest.approx(4)
    assert effective_hits(8, NOW - 12 * HOUR, 0, NOW, POLICY) == pytest.approx(2)
    assert effective_hits(1, NOW - 6 * HOUR * 6, 0, NOW, POLICY) == pytest.approx(1 / 64)
    assert effective_hits(1, NOW - 6 * HOUR * 7, 0, NOW, POLICY) == 0.0  # 1/128 < 0.01
    assert effective_hits(3, 0, NOW - HOUR, NOW, POLICY) > 0  # never used: age from creation
    assert effective_hits(3, 0, 0, NOW, POLICY) == 0.0


def test_score_is_hits_plus_one_times_tokens_per_marginal_byte() -> None:
    e = entry("a", hits=3, last_used=NOW)
    assert eviction_score(e, 500, NOW, POLICY) == pytest.approx((3 + 1) * 1000 / 500)


def test_the_lowest_score_goes_first_and_recent_hits_protect() -> None:
    hot, cold = entry("hot", hits=4, last_used=NOW), entry("cold")
    assert victims([hot, cold], budget=1500) == ("cold",)
    recent_hit = entry("recent", hits=1, last_used=NOW - HOUR / 2)
    assert victims([recent_hit, cold], budget=1500) == ("cold",)
    decayed_hit = entry("decayed", hits=1, last_used=NOW - 60 * HOUR)  # 2^-10 < 0.01: counts as 0
    assert eviction_score(decayed_hit, 1000, NOW, POLICY) == eviction_score(cold, 1000, NOW, POLICY)


def test_ties_evict_the_older_last_used_first() -> None:
    entries = [entry("young", last_used=NOW - HOUR), entry("old", last_used=NOW - 2 * HOUR)]
    assert victims(entries, budget=1500) == ("old",)


def test_anchor_checkpoints_score_twice() -> None:
    anchored = entry("a", reason="cold")
    assert eviction_score(anchored, 1000, NOW, POLICY) == 2 * eviction_score(entry("a"), 1000, NOW, POLICY)
    for reason in ("evict", "shutdown"):
        entries = [entry("anchor", reason=reason, num_tokens=600), entry("plain", num_tokens=1000)]
        assert victims(entries, budget=1500) == ("plain",)  # 600 x 2 beats 1000


def test_a_superseded_continued_checkpoint_is_penalized() -> None:
    superseded = entry("old", is_superseded=True, num_tokens=5000)
    assert eviction_score(superseded, 1000, NOW, POLICY) == pytest.approx(0.05 * 5000 / 1000)
    hit = entry("old", is_superseded=True, hits=1, last_used=NOW)
    h = 1 / 2  # eh = 1
    assert eviction_score(hit, 1000, NOW, POLICY) == pytest.approx(2 * 1000 / 1000 * (0.05 + 0.45 * h))
    assert victims([superseded, entry("other")], budget=1500) == ("old",)
    not_continued = entry("cold", reason="cold", is_superseded=True)
    assert eviction_score(not_continued, 1000, NOW, POLICY) == 2 * 1000 / 1000  # only `continued` entries


def test_eviction_makes_room_for_the_incoming_store_before_it_is_written() -> None:
    entries = [entry("a"), entry("b", last_used=NOW - 2 * HOUR), entry("c")]
    assert victims(entries, budget=3000) == ()  # fits with nothing incoming
    assert victims(entries, budget=3500, store=incoming(1000)) == ("b",)
    assert victims(entries, budget=4000, store=incoming(1000)) == ()


def test_the_entry_being_written_and_just_loaded_entries_are_never_victims() -> None:
    entries = [entry("new", last_used=0), entry("loaded", is_protected=True, last_used=0), entry("c", hits=9)]
    assert victims(entries, budget=3000, store=incoming(1000)) == ("c",)
    plan = plan_eviction(entries, sizes(entries), 1500, NOW, incoming(1000), POLICY)
    assert plan.outcome == "no_room" and plan.victim_ids == ()  # nothing evicted for a store that is skipped


def test_a_store_that_cannot_fit_the_budget_is_skipped_without_evicting() -> None:
    assert fits_budget(1000, 1010, POLICY) and not fits_budget(1000, 1009, POLICY)
    entries = [entry("a")]
    plan = plan_eviction(entries, sizes(entries), 1009, NOW, incoming(500, num_bytes=1000), POLICY)
    assert plan.outcome == "too_large" and plan.victim_ids == ()


def test_marginal_bytes_count_only_chunks_no_one_else_uses() -> None:
    # "shared" shares 2 of its 3 chunks with "keeper": deleting it frees 1000 bytes, not 3000.
    entries = [
        entry("keeper", chunks="pq", hits=50, last_used=NOW),
        entry("shared", chunks="pqr", num_tokens=1500),
        entry("alone", chunks="st", num_tokens=1500),
    ]
    # per freed byte: shared 1500/1000, alone 1500/2000 -> alone goes although both hold 1500 tokens
    assert victims(entries, budget=4500) == ("alone",)


def test_chunks_the_incoming_store_reuses_are_not_counted_as_freed() -> None:
    entries = [entry("a", chunks="pq"), entry("b", chunks="rs", last_used=NOW - 2 * HOUR)]
    # Without reuse b (older) would go; the incoming reuses p and q, so evicting a frees nothing.
    assert victims(entries, budget=4500, store=incoming(1000, chunks="pqz")) == ("b",)
    assert victims(entries, budget=4500, store=incoming(1000, chunks="rsz")) == ("a",)


def test_after_an_eviction_the_scores_of_former_sharers_are_recomputed() -> None:
    entries = [
        entry("x", chunks="pq", last_used=NOW - 3 * HOUR),
        entry("y", chunks="pq", last_used=NOW - 2 * HOUR),
    ]
    # Both free 0 bytes while they share: x (older) goes first, then y frees both chunks.
    assert victims(entries, budget=0) == ("x", "y")


def test_trimming_to_budget_without_an_incoming_store() -> None:
    entries = [entry(name, last_used=NOW - i * HOUR) for i, name in enumerate("abcd")]
    assert victims(entries, budget=2500) == ("d", "c")
