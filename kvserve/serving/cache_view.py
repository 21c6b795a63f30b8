"""What the web console shows of the KV cache: the RAM block pool and the disk tier's checkpoints.

Plain data read at request time through functions the composition root (`kvserve serve`)
supplies, like `EngineStats`, so the HTTP layer never touches the engine or the store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlockPoolView:
    block_size: int
    num_blocks: int  # usable blocks
    num_used_blocks: int  # held by requests in flight
    num_cached_blocks: int  # holding a cached prefix (in use or free for reuse)
    num_free_blocks: int  # allocatable (cached-but-free ones included)
    num_touched_blocks: int = 0  # ever handed out (on CPU, the part of the pool that is resident)
    block_bytes: int = 0  # KV bytes of one block, all layers


@dataclass(frozen=True, slots=True)
class CheckpointView:
    checkpoint_id: str
    reason: str  # cold, continued, evict, shutdown, agent_system, agent_session
    num_tokens: int
    total_bytes: int  # manifest + every chunk it uses
    marginal_bytes: int  # what deleting it would free (chunks no other checkpoint uses)
    hits: int
    effective_hits: float  # hits decayed by age, as eviction counts them
    created: float  # wall clock
    last_used: float
    score: float  # eviction score: the lowest goes first


@dataclass(frozen=True, slots=True)
class DiskTierView:
    directory: str
    budget_bytes: int
    num_bytes: int
    checkpoints: Sequence[CheckpointView]

    @property
    def num_checkpoints(self) -> int:
        return len(self.checkpoints)


@dataclass(frozen=True, slots=True)
class CacheView:
    pool: BlockPoolView
    disk: DiskTierView | None  # None without the disk tier (--no-kv-cache)


CacheViewSource = Callable[[], CacheView]
