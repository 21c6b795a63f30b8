"""What a replica publishes about itself (Ray Serve's `record_routing_stats`, a plain dict on the
wire): its load and its cache counters since start."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class ReplicaStats:
    tag: str
    pid: int = 0  # the replica's process, on its node
    node_id: str = ""
    num_running: int = 0  # sequences in the engine
    num_waiting: int = 0  # queued in the engine
    kv_usage: float = 0.0  # fraction of the RAM KV pool held by requests
    num_prompt_tokens: int = 0  # since start, as /metrics' kvserve_prompt_tokens
    num_cached_prompt_tokens: int = 0  # of those, served from RAM or the disk tier
    num_generation_tokens: int = 0
    num_disk_hit_tokens: int = 0  # of the cached ones, loaded from the disk tier

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReplicaStats | None:
        """None for what is not a replica's stats (Ray's default is {})."""
        if not isinstance(data.get("tag"), str):
            return None
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def hit_rate(self) -> float:
        return self.num_cached_prompt_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0
