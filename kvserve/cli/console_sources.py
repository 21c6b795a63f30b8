"""The web console's data, wired by `kvserve serve` (the composition root): the engine's RAM
block pool and disk tier read into `serving.cache_view`'s plain records, and the disk tier's
per-request prompt source fed into the request recorder."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kvserve.serving.cache_view import BlockPoolView, CacheView, CheckpointView, DiskTierView
from kvserve.serving.request_recorder import PromptSource, RequestRecorder

if TYPE_CHECKING:
    from kvserve.engine.core import EngineCore
    from kvserve.kvstore.checkpoint_store import CheckpointStore


class DiskViewCache:
    """The disk tier's checkpoint list, rebuilt at most every `max_age_s`: listing 1,000 checkpoints
    costs ~0.2 s here (the index reads each one's chunks), so however many pages poll, the store is
    scanned at most once per period. Thread-safe (HTTP worker threads)."""

    def __init__(
        self, store: CheckpointStore, max_age_s: float = 2.0, clock: Callable[[], float] = time.monotonic
    ):
        self.store = store
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._view: DiskTierView | None = None
        self._built_at = 0.0

    def get(self) -> DiskTierView:
        with self._lock:
            if self._view is None or self._clock() - self._built_at >= self.max_age_s:
                self._view = disk_view(self.store)
                self._built_at = self._clock()
            return self._view


def cache_source(core: EngineCore) -> Callable[[], CacheView]:
    """The web console's view of the engine's KV cache (see `cache_view`)."""
    disk = DiskViewCache(core.disk_tier.store) if core.disk_tier is not None else None
    return lambda: cache_view(core, disk)


def cache_view(core: EngineCore, disk: DiskViewCache | None) -> CacheView:
    """Read from an HTTP worker thread while the engine runs: the pool's counts are plain int reads
    (a snapshot that may be one step stale); the store locks its index."""
    kv = core.kv_manager
    pool = kv.pool
    num_usable = pool.num_usable_blocks
    pool_view = BlockPoolView(
        kv.block_size,
        num_usable,
        num_usable - pool.num_free_blocks,
        pool.num_cached_blocks,
        pool.num_free_blocks,
        pool.num_touched_blocks,
        core.kv_block_bytes,
    )
    return CacheView(pool_view, None if disk is None else disk.get())


def disk_view(store: CheckpointStore) -> DiskTierView:
    """Every checkpoint with its eviction score (reads the store's index: ~ms per 100 entries)."""
    checkpoints = [
        CheckpointView(
            checkpoint.checkpoint_id,
            checkpoint.meta.reason,
            checkpoint.meta.num_tokens,
            checkpoint.num_bytes,
            scored.marginal_bytes,
            checkpoint.meta.hits,
            scored.effective_hits,
            checkpoint.meta.created,
            checkpoint.meta.last_used,
            scored.score,
        )
        for checkpoint, scored in store.scored_checkpoints()
    ]
    return DiskTierView(str(store.directory), store.budget_bytes, store.stats().total_bytes, checkpoints)


def feed_prompt_sources(core: EngineCore, recorder: RequestRecorder) -> None:
    """Tell the recorder where each admitted prompt's cached prefix came from (RAM, disk)."""
    if core.disk_tier is None:
        return  # the engine's cached-token count alone says RAM or cold

    def on_source(request_id: str, num_ram: int, num_disk: int, checkpoint_id: str | None) -> None:
        recorder.note_source(request_id, PromptSource(num_ram, num_disk, checkpoint_id))

    core.disk_tier.on_source = on_source


def checkpoint_tokens(core: EngineCore, checkpoint_id: str) -> Sequence[int] | None:
    return None if core.disk_tier is None else core.disk_tier.store.token_ids(checkpoint_id)
