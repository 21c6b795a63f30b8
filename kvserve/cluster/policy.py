"""Where a request goes (the router's policy, free of Ray): (1) its session's replica, or the replica
that stored the response it continues; (2) otherwise the replica holding the longest prefix of its
prompt beyond what all sessions share; (3) otherwise the least-loaded replica. A replica at its load
threshold takes no new sessions. Why in this order: docs/cluster.md."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from kvserve.cluster.prefix_index import PrefixIndex
from kvserve.cluster.routing_keys import RoutingKeys

Reason = Literal["response", "session", "prefix", "least_loaded"]
REASONS: tuple[Reason, ...] = ("response", "session", "prefix", "least_loaded")


@dataclass(frozen=True)
class PolicySettings:
    max_load: int = 16  # requests in flight at which a replica takes no new sessions (CPU max-num-seqs)
    min_prefix_blocks: int = 2  # private prefix blocks (of prefix_blocks.BLOCK_BYTES) that count as a hit
    session_ttl_s: float = 1800.0  # a session silent this long no longer counts towards a replica's load
    max_sessions: int = 100_000


@dataclass(frozen=True)
class ReplicaView:
    """A replica as the router sees it when it decides."""

    replica_id: str
    tag: str  # what its Responses ids carry (`routing_keys.response_id_prefix`)
    num_ongoing: int  # requests in flight on it


class RoutingDecision(NamedTuple):
    replica_id: str
    reason: Reason
    matched_blocks: int  # private prefix blocks the replica holds (reason "prefix")


class _Binding(NamedTuple):
    replica_id: str
    last_seen: float


class AffinityPolicy:
    """Pure and single-threaded (the router's event loop); time comes in as `now`."""

    def __init__(self, settings: PolicySettings | None = None, index: PrefixIndex | None = None):
        self.settings = settings or PolicySettings()
        self.index = index or PrefixIndex()
        self._sessions: OrderedDict[str, _Binding] = OrderedDict()
        self._num_routed: dict[str, int] = {}  # requests recorded per replica: the last tie-break

    def choose(self, keys: RoutingKeys, replicas: Sequence[ReplicaView], now: float) -> RoutingDecision:
        assert replicas, "the router waits for replicas before it asks"
        by_id = {r.replica_id: r for r in replicas}
        if keys.replica_tag is not None:
            # The stored response lives there: correctness first, so it outranks the session.
            for replica in replicas:
                if replica.tag == keys.replica_tag:
                    return RoutingDecision(replica.replica_id, "response", 0)
        key = keys.session_key
        binding = self._sessions.get(key) if key is not None else None
        if binding is not None and binding.replica_id in by_id:
            return RoutingDecision(binding.replica_id, "session", 0)
        open_replicas = [r for r in replicas if r.num_ongoing < self.settings.max_load] or list(replicas)
        prefix = self._best_prefix(keys.prefix_hashes, open_replicas, now)
        if prefix is not None:
            return prefix
        return RoutingDecision(self._least_loaded(open_replicas, now).replica_id, "least_loaded", 0)

    def record(self, keys: RoutingKeys, replica_id: str, now: float) -> None:
        """The request went to `replica_id` (the chosen one, or another when it was full)."""
        self._num_routed[replica_id] = self._num_routed.get(replica_id, 0) + 1
        key = keys.session_key
        if key is not None:
            self._sessions[key] = _Binding(replica_id, now)
            self._sessions.move_to_end(key)
            while len(self._sessions) > self.settings.max_sessions:
                self._sessions.popitem(last=False)
        if keys.prefix_hashes:
            self.index.insert(replica_id, keys.prefix_hashes)

    def forget_replica(self, replica_id: str) -> None:
        """It died or was removed: its sessions are routed afresh (and stick to their new replica)."""
        self.index.remove_replica(replica_id)
        self._num_routed.pop(replica_id, None)
        for key in [k for k, b in self._sessions.items() if b.replica_id == replica_id]:
            del self._sessions[key]

    def session_counts(self, now: float) -> dict[str, int]:
        """Replica id -> its live sessions (heard from within `session_ttl_s`), in one pass."""
        horizon = now - self.settings.session_ttl_s
        counts: dict[str, int] = {}
        for binding in self._sessions.values():
            if binding.last_seen >= horizon:
                counts[binding.replica_id] = counts.get(binding.replica_id, 0) + 1
        return counts

    def num_sessions(self, replica_id: str, now: float) -> int:
        """Sessions bound to the replica and heard from within `session_ttl_s`."""
        horizon = now - self.settings.session_ttl_s
        return sum(
            1 for b in self._sessions.values() if b.replica_id == replica_id and b.last_seen >= horizon
        )

    def _best_prefix(
        self, hashes: Sequence[int], replicas: Sequence[ReplicaView], now: float
    ) -> RoutingDecision | None:
        if not hashes:
            return None
        shared = self.index.shared_length(hashes)
        scored = [(self.index.matched_length(r.replica_id, hashes) - shared, r) for r in replicas]
        best = max(score for score, _ in scored)
        if best < self.settings.min_prefix_blocks:
            return None
        winner = self._least_loaded([r for score, r in scored if score == best], now)
        return RoutingDecision(winner.replica_id, "prefix", best)

    def _least_loaded(self, replicas: Sequence[ReplicaView], now: float) -> ReplicaView:
        # Requests in flight first; between equals, fewer live sessions, then fewer requests routed, so
        # that work arriving at quiet moments (sessions or not) still spreads; the id last, for a
        # deterministic choice.
        return min(
            replicas,
            key=lambda r: (
                r.num_ongoing,
                self.num_sessions(r.replica_id, now),
                self._num_routed.get(r.replica_id, 0),
                r.replica_id,
            ),
        )
