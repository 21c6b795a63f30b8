"""CheckpointWriter: saves checkpoints on a background thread so the engine never waits on disk.

The engine copies a checkpoint's KV out of its blocks (the only work on its thread) and
submits a SaveJob; a queue bounded in jobs and in the bytes of their copies keeps a slow disk
from piling up copies in memory: a job beyond either bound is dropped (a checkpoint is an
optimization, never a correctness need). The bytes bound holds the copies in memory to about
`max_pending_bytes` whatever the context length and the model's KV per token (docs/reliability.md).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvserve.kvstore.checkpoint import CheckpointMeta, SaveResult
from kvserve.kvstore.checkpoint_store import CheckpointStore, ChunkProvider

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SaveJob:
    meta: CheckpointMeta
    token_ids: Sequence[int]
    block_hashes: Sequence[int]
    provider: ChunkProvider  # must read copies, not live KV blocks the engine may reuse
    # A checkpoint this one replaces (an agent session's previous turn): deleted once this one is
    # stored, so a long session keeps one checkpoint instead of one per turn. Its chunks that this
    # one shares stay (chunks are reference counted); only its own tail chunk and manifest go.
    supersedes: str | None = None
    num_bytes: int = 0  # of the KV copies the provider holds, until the job is done


@dataclass
class WriterStats:
    num_saved: int = 0
    num_skipped: int = 0  # exists / too large / no room / incompatible
    num_dropped: int = 0  # queue full or writer closed
    num_failed: int = 0  # I/O errors (disk full, unwritable directory)


class CheckpointWriter:
    def __init__(
        self,
        store: CheckpointStore,
        max_pending: int = 4,
        on_result: Callable[[SaveResult], None] | None = None,
        max_pending_bytes: int | None = None,
    ) -> None:
        self.store = store
        self.stats = WriterStats()
        self._on_result = on_result
        self._queue: queue.Queue[SaveJob | None] = queue.Queue(max_pending)
        # Copies queued or being written; one job is always taken, however large, when none is.
        self.max_pending_bytes = max_pending_bytes
        self._pending_bytes = 0
        self._bytes_lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kvstore-writer", daemon=True)
        self._thread.start()

    def submit(self, job: SaveJob, *, block: bool = False) -> bool:
        """Queue a save without blocking (`block`: wait for room, as at shutdown); False if it was
        dropped (queue full or closed)."""
        if self._closed:
            self.stats.num_dropped += 1
            return False
        # Before the put, so that it precedes the writer's outcome line (the crash harness reads the
        # log as the writer's queue: which save a kill -9 cut).
        meta = job.meta
        logger.info(
            "kvstore: queued %s checkpoint %s (%d tokens)", meta.reason, meta.checkpoint_id, meta.num_tokens
        )
        if not self._reserve(job.num_bytes, force=block):
            self.stats.num_dropped += 1
            logger.warning(
                "kvstore: writer busy (%.0f MiB of copies pending), dropping %s checkpoint %s of %d tokens",
                self._pending_bytes / 2**20,
                meta.reason,
                meta.checkpoint_id,
                meta.num_tokens,
            )
            return False
        try:
            self._queue.put(job, block=block)
        except queue.Full:
            self._release(job.num_bytes)
            self.stats.num_dropped += 1
            logger.warning(
                "kvstore: writer busy, dropping %s checkpoint %s of %d tokens",
                meta.reason,
                meta.checkpoint_id,
                meta.num_tokens,
            )
            return False
        return True

    def _reserve(self, num_bytes: int, force: bool) -> bool:
        with self._bytes_lock:
            limit = self.max_pending_bytes
            is_over = limit is not None and self._pending_bytes + num_bytes > limit
            if is_over and self._pending_bytes and not force:
                return False
            self._pending_bytes += num_bytes
            return True

    def _release(self, num_bytes: int) -> None:
        with self._bytes_lock:
            self._pending_bytes -= num_bytes

    def flush(self) -> None:
        """Wait until every submitted job has been written (or has failed)."""
        self._queue.join()

    def close(self) -> None:
        """Finish the queued jobs, then stop the thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        from kvserve.openmp import confine_to_one_thread

        confine_to_one_thread()  # its tensor copies must not give it an OpenMP team (kvserve/openmp.py)
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                self._save(job)
                self._release(job.num_bytes)
            finally:
                self._queue.task_done()

    def _save(self, job: SaveJob) -> None:
        try:
            result = self.store.save(job.meta, job.token_ids, job.block_hashes, job.provider)
        except OSError as error:  # the store reports disk errors as "failed"; this is a safety net
            self.stats.num_failed += 1
            logger.warning("kvstore: could not save checkpoint %s: %s", job.meta.checkpoint_id, error)
            return
        except Exception:  # the thread's edge: log and keep the writer alive for the next job
            self.stats.num_failed += 1
            logger.exception("kvstore: saving checkpoint %s failed", job.meta.checkpoint_id)
            return
        if result.status == "stored":
            self.stats.num_saved += 1
            self._delete_superseded(job, result.checkpoint_id)
        elif result.status == "failed":  # a disk error, already logged by the store
            self.stats.num_failed += 1
        else:
            self.stats.num_skipped += 1
            logger.info("kvstore: checkpoint %s not stored: %s", result.checkpoint_id, result.status)
        if self._on_result is not None:
            self._on_result(result)

    def _delete_superseded(self, job: SaveJob, stored_id: str) -> None:
        if job.supersedes is None or job.supersedes == stored_id:
            return
        # Logged before the delete, so that a crash inside it never hides that it was meant.
        logger.info("kvstore: deleting checkpoint %s, superseded by %s", job.supersedes, stored_id)
        try:
            self.store.delete(job.supersedes)
        except OSError as error:  # eviction removes it later; the new checkpoint is what matters
            logger.warning("kvstore: could not delete superseded checkpoint %s: %s", job.supersedes, error)
