"""The web console's data, wired by `kvserve serve` (the composition root): the engine's RAM
block pool and disk tier read into `serving.cache_view`'s plain records, and the disk tier's
per-request prompt source fed into the request recorder."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvserve.serving.cache_view import BlockPoolView, CacheView, CheckpointView, DiskTierView
from kvserve.serving.request_recorder import PromptSource, RequestRecorder

if TYPE_CHECKING:
    from kvserve.engine.core import EngineCore


def cache_view(core: EngineCore) -> CacheView:
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
    )
    tier = core.disk_tier
    if tier is None:
        return CacheView(pool_view, None)
    store = tier.store
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
    disk = DiskTierView(str(store.directory), store.budget_bytes, store.stats().total_bytes, checkpoints)
    return CacheView(pool_view, disk)


def feed_prompt_sources(core: EngineCore, recorder: RequestRecorder) -> None:
    """Tell the recorder where each admitted prompt's cached prefix came from (RAM, disk)."""
    if core.disk_tier is None:
        return  # the engine's cached-token count alone says RAM or cold

    def on_source(request_id: str, num_ram: int, num_disk: int, checkpoint_id: str | None) -> None:
        recorder.note_source(request_id, PromptSource(num_ram, num_disk, checkpoint_id))

    core.disk_tier.on_source = on_source


def checkpoint_tokens(core: EngineCore, checkpoint_id: str) -> Sequence[int] | None:
    return None if core.disk_tier is None else core.disk_tier.store.token_ids(checkpoint_id)
