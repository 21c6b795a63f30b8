"""The policy (`policy.AffinityPolicy`) as a Ray Serve request router: Ray calls `choose_replicas` with
the handle call's arguments (the ingress passes `RoutingKeys` first) and tells it where each request
went and when it finished. Ray then picks within the ranks returned: a session's (or stored response's)
replica alone; otherwise the chosen replica, else (when it is full or does not answer) the others,
least loaded first."""

from __future__ import annotations

import logging
import time
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

# The board through its module: this module is pickled by value (Ray ships the router class so), and a
# name imported from elsewhere would travel as a copy of the object instead of the process's one.
from kvserve.cluster import board
from kvserve.cluster.in_flight import InFlight
from kvserve.cluster.policy import AffinityPolicy, PolicySettings, ReplicaView, RoutingDecision
from kvserve.cluster.replica_stats import ReplicaStats
from kvserve.cluster.routing_keys import RoutingKeys

logger = logging.getLogger(__name__)

# Live sessions per replica, for /metrics and the console: counted at most this often (a pass over every
# session the router knows), not on each request.
_SESSIONS_PERIOD_S = 1.0


class KvserveRequestRouter(RequestRouter):
    def initialize_state(self, **kwargs: Any) -> None:
        """`request_router_kwargs`: PolicySettings' fields."""
        self._policy = AffinityPolicy(PolicySettings(**kwargs))
        # internal request id -> (its keys, the decision), until Ray says where it went
        self._pending: dict[str, tuple[RoutingKeys, RoutingDecision]] = {}
        self._in_flight = InFlight()  # the load the policy sees, by full replica id
        self._sessions_counted_at = 0.0  # when _publish last counted sessions (a pass over all of them)

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if pending_request is None or not candidate_replicas:
            return [candidate_replicas]
        keys = _keys_of(pending_request)
        now = time.time()
        ongoing = self._in_flight.counts(now)
        views = [_view(r, ongoing) for r in candidate_replicas]
        decision = self._policy.choose(keys, views, now)
        request_id = pending_request.metadata.internal_request_id
        self._pending[request_id] = (keys, decision)
        self._in_flight.chosen(request_id, decision.replica_id, now)
        chosen = [r for r in candidate_replicas if r.replica_id.to_full_id_str() == decision.replica_id]
        if decision.reason in ("session", "response"):
            # Affinity: wait for that replica (Ray backs off and asks again) rather than move the
            # conversation because it was slow to answer a queue-length probe (a busy CPU replica
            # misses Ray's 0.1-1 s deadline). If it died, Ray drops it and the policy picks anew.
            return [chosen]
        rest = sorted(
            (r for r in candidate_replicas if r not in chosen),
            key=lambda r: ongoing.get(r.replica_id.to_full_id_str(), 0),
        )
        return [chosen, rest] if rest else [chosen]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        request_id = pending_request.metadata.internal_request_id
        keys, decision = self._pending.pop(request_id, (_keys_of(pending_request), None))
        self._in_flight.routed(request_id, replica_id.to_full_id_str(), time.time())
        self._policy.record(keys, replica_id.to_full_id_str(), time.time())
        if decision is not None and decision.replica_id == replica_id.to_full_id_str():
            board.BOARD.count_decision(decision.reason, replica_id.unique_id)
        else:  # the chosen one was full or did not answer: Ray took the next rank
            board.BOARD.count_decision("least_loaded", replica_id.unique_id)
        self._publish()

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self._in_flight.finished(internal_request_id)
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
        self._in_flight.forget_replica(replica_id.to_full_id_str())

    def _publish(self) -> None:
        """The replicas' published stats and this router's counts, for the ingress's /metrics."""
        stats: dict[str, ReplicaStats] = {}
        for replica in self._replicas.values():
            published = ReplicaStats.from_dict(replica.routing_stats or {})
            stats[replica.replica_id.unique_id] = published or ReplicaStats(tag=replica.replica_id.unique_id)
        now = time.time()
        counts = self._in_flight.counts(now)
        ongoing = {
            r.replica_id.unique_id: counts.get(r.replica_id.to_full_id_str(), 0)
            for r in self._replicas.values()
        }
        sessions = None
        if now - self._sessions_counted_at >= _SESSIONS_PERIOD_S:
            self._sessions_counted_at = now
            by_id = self._policy.session_counts(now)
            sessions = {
                r.replica_id.unique_id: by_id.get(r.replica_id.to_full_id_str(), 0)
                for r in self._replicas.values()
            }
        board.BOARD.set_replicas(stats, ongoing, now, sessions)


def _view(replica: RunningReplica, ongoing: dict[str, int]) -> ReplicaView:
    full_id = replica.replica_id.to_full_id_str()
    return ReplicaView(full_id, replica.replica_id.unique_id, ongoing.get(full_id, 0))


def _keys_of(pending_request: PendingRequest) -> RoutingKeys:
    args = pending_request.args
    return args[0] if args and isinstance(args[0], RoutingKeys) else RoutingKeys()
