"""The policy (`policy.AffinityPolicy`) as a Ray Serve request router: Ray calls `choose_replicas` with
the handle call's arguments (the ingress passes `RoutingKeys` first) and tells it where each request
went and when it finished. Ray then picks within the ranks returned: the chosen replica, else (when it
is full or does not answer) the others, least loaded first."""

from __future__ import annotations

import logging
import time
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

# The board through its module: this module is pickled by value (Ray ships the router class so), and a
# name imported from elsewhere would travel as a copy of the object instead of the process's one.
from kvserve.cluster import board
from kvserve.cluster.policy import AffinityPolicy, PolicySettings, ReplicaView, RoutingDecision
from kvserve.cluster.replica_stats import ReplicaStats
from kvserve.cluster.routing_keys import RoutingKeys

logger = logging.getLogger(__name__)


class KvserveRequestRouter(RequestRouter):
    def initialize_state(self, **kwargs: Any) -> None:
        """`request_router_kwargs`: PolicySettings' fields."""
        self._policy = AffinityPolicy(PolicySettings(**kwargs))
        # internal request id -> (its keys, the decision), until Ray says where it went
        self._pending: dict[str, tuple[RoutingKeys, RoutingDecision]] = {}
        # internal request id -> replica, while it runs (the load the policy sees)
        self._running: dict[str, ReplicaID] = {}

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if pending_request is None or not candidate_replicas:
            return [candidate_replicas]
        keys = _keys_of(pending_request)
        ongoing = self._ongoing_by_replica()
        views = [
            ReplicaView(r.replica_id.to_full_id_str(), r.replica_id.unique_id, ongoing.get(r.replica_id, 0))
            for r in candidate_replicas
        ]
        decision = self._policy.choose(keys, views, time.time())
        self._pending[pending_request.metadata.internal_request_id] = (keys, decision)
        chosen = [r for r in candidate_replicas if r.replica_id.to_full_id_str() == decision.replica_id]
        rest = sorted(
            (r for r in candidate_replicas if r not in chosen), key=lambda r: ongoing.get(r.replica_id, 0)
        )
        return [chosen, rest] if rest else [chosen]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        request_id = pending_request.metadata.internal_request_id
        keys, decision = self._pending.pop(request_id, (_keys_of(pending_request), None))
        self._running[request_id] = replica_id
        self._policy.record(keys, replica_id.to_full_id_str(), time.time())
        if decision is not None and decision.replica_id == replica_id.to_full_id_str():
            board.BOARD.count_decision(decision.reason, replica_id.unique_id)
        else:  # the chosen one was full or did not answer: Ray took the next rank
            board.BOARD.count_decision("least_loaded", replica_id.unique_id)
        self._publish()

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self._running.pop(internal_request_id, None)
        self._pending.pop(internal_request_id, None)
        self._publish()

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._forget(replica_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        old = set(self._replica_id_set)
        super().update_replicas(replicas)
        for replica_id in old - set(self._replica_id_set):
            self._forget(replica_id)
        self._publish()

    def _forget(self, replica_id: ReplicaID) -> None:
        logger.info("router: replica %s is gone; its sessions will be routed afresh", replica_id.unique_id)
        self._policy.forget_replica(replica_id.to_full_id_str())
        for request_id in [k for k, v in self._running.items() if v == replica_id]:
            del self._running[request_id]

    def _ongoing_by_replica(self) -> dict[ReplicaID, int]:
        counts: dict[ReplicaID, int] = {}
        for replica_id in self._running.values():
            counts[replica_id] = counts.get(replica_id, 0) + 1
        return counts

    def _publish(self) -> None:
        """The replicas' published stats and this router's counts, for the ingress's /metrics."""
        stats: dict[str, ReplicaStats] = {}
        for replica in self._replicas.values():
            published = ReplicaStats.from_dict(replica.routing_stats or {})
            stats[replica.replica_id.unique_id] = published or ReplicaStats(tag=replica.replica_id.unique_id)
        ongoing = {rid.unique_id: n for rid, n in self._ongoing_by_replica().items()}
        board.BOARD.set_replicas(stats, ongoing)


def _keys_of(pending_request: PendingRequest) -> RoutingKeys:
    args = pending_request.args
    return args[0] if args and isinstance(args[0], RoutingKeys) else RoutingKeys()
