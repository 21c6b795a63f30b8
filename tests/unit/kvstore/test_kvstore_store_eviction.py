"""Eviction wired into CheckpointStore.save: budgets in real file bytes, supersession found
through the chain hashes, just-loaded protection, trimming at open."""

from __future__ import annotations

from pathlib import Path

from kvstore_helpers import Clock, Provider, kv_for, open_store, random_tokens, save, text_of

from kvserve.kvstore.checkpoint import TextKey

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


def test_hits_decay_with_the_clock_until_an_unused_entry_outlives_an_old_favourite(tmp_path: Path) -> None:
    clock = Clock()
    favourite, fresh, incoming = random_tokens(64, 11), random_tokens(64, 12), random_tokens(64, 13)
    budget = 2 * size_of(tmp_path, favourite) + 100
    store = open_store(tmp_path / "kv", budget_bytes=budget, clock=clock)
    save(store, favourite, reason="continued")
    for _ in range(3):
        store.touch(checkpoint_id(favourite), hit=True)  # hits, but no load protection
    clock.now += HOUR
    save(store, fresh, reason="continued")
    clock.now += HOUR  # favourite: eh = 3 x 2^(-2/6) ~ 2.4, so (eh + 1) beats fresh's 1
    assert save(store, incoming, reason="continued").evicted_ids == (checkpoint_id(fresh),)
    store.delete(checkpoint_id(incoming))
    save(store, fresh, reason="continued")
    clock.now += 6 * HOUR * 9  # 54 h later: 3 x 2^-9 < 0.01 counts as 0 hits, a tie on score
    assert save(store, incoming, reason="continued").evicted_ids == (checkpoint_id(favourite),)


def test_equal_scores_evict_the_least_recently_used_first(tmp_path: Path) -> None:
    clock = Clock()
    first, second, incoming = random_tokens(64, 14), random_tokens(64, 15), random_tokens(64, 16)
    store = open_store(tmp_path / "kv", budget_bytes=2 * size_of(tmp_path, first) + 100, clock=clock)
    save(store, first, reason="continued")
    clock.now += 1
    save(store, second, reason="continued")
    clock.now += 1
    store.touch(checkpoint_id(first))  # used later than second, no hit: same score, newer last_used
    assert save(store, incoming, reason="continued").evicted_ids == (checkpoint_id(second),)


def test_trimming_waits_for_a_save_in_flight_and_never_takes_what_it_reuses(tmp_path: Path) -> None:
    import threading

    clock = Clock()
    base = random_tokens(64, 17)
    extended = base + random_tokens(32, 18)
    store = open_store(tmp_path / "kv", clock=clock)
    save(store, base, reason="continued")
    release, started = threading.Event(), threading.Event()
    inner = Provider(kv_for(extended, store.identity))

    def slow(span):
        started.set()
        assert release.wait(10)
        return inner(span)

    results = []
    saver = threading.Thread(target=lambda: results.append(save(store, extended, "continued", slow)))
    saver.start()
    assert started.wait(10)  # the save is writing its new chunks; base's 4 chunks are reused
    store.budget_bytes = 0
    trimmer = threading.Thread(target=store.evict_to_budget)
    trimmer.start()
    trimmer.join(0.2)
    assert trimmer.is_alive()  # waits instead of deleting the reused chunks under the save
    release.set()
    saver.join(10)
    trimmer.join(10)
    assert results[0].status == "stored"
    assert store.stats().num_checkpoints == 0  # then trims everything to the zero budget
