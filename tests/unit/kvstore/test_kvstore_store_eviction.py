"""Eviction wired into CheckpointStore.save: budgets in real file bytes, supersession found
through the chain hashes, just-loaded protection, trimming at open."""

from __future__ import annotations

from pathlib import Path

from kvstore_helpers import Clock, Provider, kv_for, open_store, random_tokens, save, text_of

from kvserve.kvstore import TextKey

HOUR = 3600.0


def checkpoint_id(token_ids: list[int]) -> str:
    return TextKey.of(text_of(token_ids)).sha1


def size_of(tmp_path: Path, token_ids: list[int]) -> int:
    """Bytes one checkpoint takes on its own (measured in a scratch store)."""
    scratch = open_store(tmp_path / f"scratch-{len(token_ids)}-{token_ids[0]}")
    save(scratch, token_ids)
    return scratch.stats().total_bytes


def test_a_store_larger_than_the_budget_is_skipped_and_writes_nothing(tmp_path: Path) -> None:
    tokens = random_tokens(64, 0)
    store = open_store(tmp_path / "kv", budget_bytes=size_of(tmp_path, tokens))  # no room for the 1% margin
    provider = Provider(kv_for(tokens, store.identity))
    assert save(store, tokens, provider=provider).status == "too_large"
    assert provider.calls == [] and store.stats().total_bytes == 0


def test_saving_evicts_the_lowest_score_first_and_stays_within_budget(tmp_path: Path) -> None:
    clock = Clock()
    a, b, c = random_tokens(64, 1), random_tokens(64, 2), random_tokens(64, 3)
    budget = 2 * size_of(tmp_path, a) + 100
    store = open_store(tmp_path / "kv", budget_bytes=budget, clock=clock)
    save(store, a, reason="cold")
    clock.now += HOUR
    save(store, b, reason="continued")
    clock.now += HOUR
    result = save(store, c, reason="continued")
    assert result.status == "stored" and result.evicted_ids == (checkpoint_id(b),)  # a is an anchor
    assert store.stats().total_bytes <= budget and store.stats().num_evictions == 1


def test_a_superseded_continued_checkpoint_goes_before_an_older_one(tmp_path: Path) -> None:
    clock = Clock()
    conversation, other = random_tokens(100, 4), random_tokens(64, 5)
    budget = size_of(tmp_path, conversation) + size_of(tmp_path, other) + 100
    store = open_store(tmp_path / "kv", budget_bytes=budget, clock=clock)
    save(store, other, reason="continued")
    clock.now += HOUR
    save(store, conversation[:50], reason="continued")  # ends mid-block: supersession via the tail key
    clock.now += HOUR
    result = save(store, conversation, reason="continued")
    assert result.evicted_ids == (checkpoint_id(conversation[:50]),)


def test_a_just_loaded_checkpoint_is_kept(tmp_path: Path) -> None:
    clock = Clock()
    a, b = random_tokens(64, 6), random_tokens(64, 7)
    store = open_store(tmp_path / "kv", budget_bytes=size_of(tmp_path, a) + 100, clock=clock)
    save(store, a)
    assert store.load(checkpoint_id(a)) is not None
    assert save(store, b).status == "no_room"
    clock.now += store.protect_loaded_s + 1  # protection expires
    assert save(store, b).evicted_ids == (checkpoint_id(a),)


def test_opening_with_a_smaller_budget_trims_the_store(tmp_path: Path) -> None:
    clock = Clock()
    store = open_store(tmp_path / "kv", clock=clock)
    token_lists = [random_tokens(64, seed) for seed in (8, 9, 10)]
    for tokens in token_lists:
        clock.now += HOUR
        save(store, tokens, reason="continued")
    one = store.stats().total_bytes // 3
    store.close()
    reopened = open_store(tmp_path / "kv", budget_bytes=one + 100, clock=clock)
    assert [c.checkpoint_id for c in reopened.checkpoints()] == [checkpoint_id(token_lists[-1])]
