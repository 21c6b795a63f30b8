"""The console's cluster page (`GET /kvserve/v1/cluster`, answered by the ingress): each replica's
load, cache hit rate and routing decisions, and the cluster's totals, from the router's board. A
single `kvserve serve` has no such route, and its console shows no cluster tab."""

from __future__ import annotations

from pydantic import BaseModel, Field

from kvserve.cluster.board import BoardSnapshot
from kvserve.cluster.policy import REASONS

CLUSTER_PATH = "/kvserve/v1/cluster"


class ClusterReplicaModel(BaseModel):
    replica: str = Field(description="Ray's tag of the replica (the x-kvserve-replica header)")
    node_id: str
    pid: int
    num_requests_in_flight: int = Field(description="requests the router has on it")
    num_sessions: int = Field(description="live sessions the router keeps on it")
    num_running: int = Field(description="sequences running in its engine")
    num_waiting: int = Field(description="requests queued in its engine")
    kv_usage: float = Field(description="fraction of its RAM KV pool held by requests (0-1)")
    num_prompt_tokens: int
    num_cached_prompt_tokens: int = Field(description="served from RAM or the disk tiers")
    num_disk_hit_tokens: int = Field(description="of those, loaded from the disk or shared tier")
    num_generation_tokens: int
    hit_rate: float = Field(description="cached / prompt tokens since it started")
    decisions: dict[str, int] = Field(description="requests routed to it, by reason")


class ClusterResponse(BaseModel):
    num_replicas: int
    hit_rate: float = Field(description="the cluster's cached / prompt tokens (live replicas)")
    num_prompt_tokens: int
    num_cached_prompt_tokens: int
    num_requests_in_flight: int
    num_sessions: int
    decisions: dict[str, int] = Field(description="requests routed, by reason (replicas gone included)")
    replicas: list[ClusterReplicaModel]


def cluster_view(snapshot: BoardSnapshot) -> ClusterResponse:
    """Pure: the board as the console shows it, replicas by tag."""
    replicas = []
    for tag in sorted(snapshot.replicas):
        stats = snapshot.replicas[tag]
        replicas.append(
            ClusterReplicaModel(
                replica=tag,
                node_id=stats.node_id,
                pid=stats.pid,
                num_requests_in_flight=snapshot.num_ongoing.get(tag, 0),
                num_sessions=snapshot.num_sessions.get(tag, 0),
                num_running=stats.num_running,
                num_waiting=stats.num_waiting,
                kv_usage=stats.kv_usage,
                num_prompt_tokens=stats.num_prompt_tokens,
                num_cached_prompt_tokens=stats.num_cached_prompt_tokens,
                num_disk_hit_tokens=stats.num_disk_hit_tokens,
                num_generation_tokens=stats.num_generation_tokens,
                hit_rate=stats.hit_rate,
                decisions={r: snapshot.decisions[(r, tag)] for r in REASONS if snapshot.decisions[(r, tag)]},
            )
        )
    queries = sum(r.num_prompt_tokens for r in replicas)
    hits = sum(r.num_cached_prompt_tokens for r in replicas)
    totals = {r: sum(n for (reason, _), n in snapshot.decisions.items() if reason == r) for r in REASONS}
    return ClusterResponse(
        num_replicas=len(replicas),
        hit_rate=hits / queries if queries else 0.0,
        num_prompt_tokens=queries,
        num_cached_prompt_tokens=hits,
        num_requests_in_flight=sum(r.num_requests_in_flight for r in replicas),
        num_sessions=sum(r.num_sessions for r in replicas),
        decisions={r: n for r, n in totals.items() if n},
        replicas=replicas,
    )
