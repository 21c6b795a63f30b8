"""A snapshot of engine load for /metrics and /health. The composition root (`kvserve serve`)
supplies the function that reads it, so the HTTP layer never touches the engine itself."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class EngineStats:
    num_running: int  # sequences being decoded or prefilled
    num_waiting: int  # queued, not yet admitted
    kv_usage: float  # fraction of KV blocks held by requests
    prefix_cache_hit_rate: float  # hit tokens / query tokens since start


EngineStatsSource = Callable[[], EngineStats]
