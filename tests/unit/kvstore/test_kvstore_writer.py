"""CheckpointWriter: saves off the caller's thread; flush, close, drop when full, survive I/O errors."""

from __future__ import annotations

import threading
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


def test_a_full_queue_drops_instead_of_blocking_the_engine(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    release = threading.Event()
    started = threading.Event()
    blocked_tokens = random_tokens(40, 0)
    inner = Provider(kv_for(blocked_tokens, store.identity))

    def slow_provider(span: ChunkSpan):
        started.set()
        assert release.wait(10)
        return inner(span)

    writer = CheckpointWriter(store, max_pending=1)
    assert writer.submit(job(blocked_tokens, slow_provider))
    assert started.wait(10)  # the writer is busy with the first job
    assert writer.submit(job(random_tokens(40, 1)))  # fills the queue
    assert not writer.submit(job(random_tokens(40, 2)))  # dropped, returns at once
    release.set()
    writer.close()
    assert writer.stats.num_saved == 2 and writer.stats.num_dropped == 1


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
