"""CheckpointWriter: saves off the caller's thread; flush, close, drop when full, survive I/O errors."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from kvstore_helpers import Provider, kv_for, make_identity, open_store, random_tokens, text_of

from kvserve.engine.kv_cache.block_hash import compute_block_hashes
from kvserve.kvstore.checkpoint import CheckpointMeta, ChunkSpan, SaveResult
from kvserve.kvstore.writer import CheckpointWriter, SaveJob


def job(token_ids: list[int], provider=None) -> SaveJob:
    identity = make_identity()
    meta = CheckpointMeta.new(identity, text_of(token_ids), len(token_ids), "continued")
    hashes = compute_block_hashes(token_ids, identity.block_size, identity.fingerprint)
    return SaveJob(meta, token_ids, hashes, provider or Provider(kv_for(token_ids, identity)))


def test_submitted_jobs_are_written_by_flush_and_close_is_idempotent(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    results: list[SaveResult] = []
    writer = CheckpointWriter(store, on_result=results.append)
    token_lists = [random_tokens(40, seed) for seed in range(3)]
    assert all(writer.submit(job(tokens)) for tokens in token_lists)
    writer.flush()
    assert [r.status for r in results] == ["stored"] * 3 and store.stats().num_checkpoints == 3
    writer.close()
    writer.close()
    assert not writer.submit(job(random_tokens(40, 9))) and writer.stats.num_dropped == 1


def test_close_drains_the_queue(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    writer = CheckpointWriter(store, max_pending=8)
    for seed in range(5):
        writer.submit(job(random_tokens(40, seed)))
    writer.close()
    assert store.stats().num_checkpoints == 5 and writer.stats.num_saved == 5


def held_provider(tokens: list[int], identity) -> tuple[Callable, threading.Event, threading.Event]:
    """A provider that holds the writer until `release` is set; `started` tells it is held."""
    release, started = threading.Event(), threading.Event()
    inner = Provider(kv_for(tokens, identity))

    def provider(span: ChunkSpan):
        started.set()
        assert release.wait(10)
        return inner(span)

    return provider, started, release


def test_a_full_queue_drops_instead_of_blocking_the_engine(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    blocked_tokens = random_tokens(40, 0)
    slow_provider, started, release = held_provider(blocked_tokens, store.identity)
    writer = CheckpointWriter(store, max_pending=1)
    assert writer.submit(job(blocked_tokens, slow_provider))
    assert started.wait(10)  # the writer is busy with the first job
    assert writer.submit(job(random_tokens(40, 1)))  # fills the queue
    assert not writer.submit(job(random_tokens(40, 2)))  # dropped, returns at once
    release.set()
    writer.close()
    assert writer.stats.num_saved == 2 and writer.stats.num_dropped == 1


def test_copies_over_the_byte_bound_are_dropped_but_one_job_always_goes(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    blocked_tokens = random_tokens(40, 0)
    slow_provider, started, release = held_provider(blocked_tokens, store.identity)

    def sized(seed: int, num_bytes: int, provider=None) -> SaveJob:
        return replace(
            job(random_tokens(40, seed) if provider is None else blocked_tokens, provider),
            num_bytes=num_bytes,
        )

    writer = CheckpointWriter(store, max_pending=8, max_pending_bytes=100)
    assert writer.submit(sized(0, 150, slow_provider))  # over the bound alone: taken, nothing pending
    assert started.wait(10)
    assert not writer.submit(sized(1, 10))  # 150 + 10 > 100 while the first is written: dropped
    release.set()
    writer.flush()
    assert writer.submit(sized(2, 60)) and writer.submit(sized(3, 40))  # 100: within the bound
    writer.close()
    assert writer.stats.num_saved == 3 and writer.stats.num_dropped == 1


def test_io_errors_are_counted_and_the_writer_keeps_going(tmp_path: Path) -> None:
    store = open_store(tmp_path)

    def failing_provider(span: ChunkSpan):
        raise OSError(28, "No space left on device")

    writer = CheckpointWriter(store)
    writer.submit(job(random_tokens(40, 0), failing_provider))
    writer.submit(job(random_tokens(40, 1)))
    writer.close()
    assert writer.stats.num_failed == 1 and writer.stats.num_saved == 1
    assert store.stats().num_checkpoints == 1


def test_loads_on_the_engine_thread_run_while_the_writer_saves(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    base = random_tokens(64, 100)
    save_job = job(base)
    store.save(save_job.meta, save_job.token_ids, save_job.block_hashes, save_job.provider)
    writer = CheckpointWriter(store, max_pending=64)
    for seed in range(20):  # conversations sharing the base prefix, saved in the background
        writer.submit(job(base + random_tokens(40, seed)))
    for _ in range(20):
        loaded = store.load(save_job.meta.checkpoint_id)
        assert loaded is not None and list(loaded.token_ids) == base
    writer.close()
    assert writer.stats.num_saved == 20 and store.stats().num_corrupt_removed == 0
    assert store.stats().num_chunks == 4 + 20 * 3  # the shared 4 chunks once, 3 own chunks each


def test_a_save_job_counts_the_bytes_of_its_copies(tmp_path: Path) -> None:
    from kvserve.engine.disk_saves import build_save_job

    store = open_store(tmp_path)
    tokens = random_tokens(40, 5)
    identity = store.identity
    copy = kv_for(tokens, identity)  # the whole prefix's KV, as copy_blocks_out gives it
    num_blocks = len(tokens) // identity.block_size

    def copy_out(block_ids: list[int]):
        return [layer[:, : len(block_ids) * identity.block_size].clone() for layer in copy]

    first = job(tokens)
    save, num_new_tokens = build_save_job(
        store, first.meta, tokens, list(first.block_hashes), list(range(num_blocks)), copy_out
    )
    per_token = 2 * identity.num_layers * identity.num_kv_heads * identity.head_dim * 2  # bf16
    assert num_new_tokens == 40 and save.num_bytes == 40 * per_token
    store.save(save.meta, save.token_ids, save.block_hashes, save.provider)
    again, _ = build_save_job(
        store, first.meta, tokens, list(first.block_hashes), list(range(num_blocks)), copy_out
    )
    assert again.num_bytes == 0  # everything stored: nothing copied
