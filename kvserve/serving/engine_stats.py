"""A snapshot of engine load for /metrics and /health. The composition root (`kvserve serve`)
supplies the function that reads it, so the HTTP layer never touches the engine itself."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class DiskCacheStats:
    """The disk KV tier since start (counts) and now (sizes); mirrors engine.disk_tier.DiskTierStats."""

    num_hits: int  # requests that loaded a prefix from disk
    num_hit_tokens: int
    num_saves: int  # checkpoints written
    num_saved_bytes: int
    num_checkpoints: int
    num_bytes: int
    num_evictions: int
    num_shared_hits: int = 0  # requests that loaded a prefix from the tier shared by replicas
    num_shared_hit_tokens: int = 0


@dataclass(frozen=True)
class EncoderCacheStats:
    """The vision-encoder output cache; mirrors engine.runner.encoder_cache.EncoderCacheStats."""

    num_hits: int  # images a step needed whose encoder rows were kept
    num_misses: int  # images it had to encode
    num_entries: int
    num_bytes: int


@dataclass(frozen=True)
class EngineStats:
    num_running: int  # sequences being decoded or prefilled
    num_waiting: int  # queued, not yet admitted
    kv_usage: float  # fraction of KV blocks held by requests
    prefix_cache_hit_rate: float  # hit tokens / query tokens since start
    disk: DiskCacheStats | None = None  # None without the disk tier
    encoder_cache: EncoderCacheStats | None = None  # None for a model that takes no images


EngineStatsSource = Callable[[], EngineStats]
