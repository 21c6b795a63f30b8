"""What the router knows, for the ingress's /metrics: each replica's published stats and in-flight
count, and the routing decisions taken. The router runs inside the ingress's process (a handle's
router lives with the handle), so one board per process joins them without another actor."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

from kvserve.cluster.policy import Reason
from kvserve.cluster.replica_stats import ReplicaStats


@dataclass
class RoutingBoard:
    replicas: dict[str, ReplicaStats] = field(default_factory=dict)  # by replica tag
    num_ongoing: dict[str, int] = field(default_factory=dict)  # by replica tag, as this router counts
    num_sessions: dict[str, int] = field(default_factory=dict)  # live sessions bound to each, by tag
    decisions: Counter[tuple[Reason, str]] = field(default_factory=Counter)  # (reason, replica tag)
    lock: threading.Lock = field(default_factory=threading.Lock)  # the router's loop vs /metrics
    # Since when the router has known no replica (None: it knows some, or has not spoken yet).
    no_replica_since: float | None = None

    def set_replicas(
        self,
        stats: dict[str, ReplicaStats],
        ongoing: dict[str, int],
        now: float,
        sessions: dict[str, int] | None = None,
    ) -> None:
        """`sessions`: None keeps the last counts (the router counts them at most once a second)."""
        with self.lock:
            self.replicas = dict(stats)
            self.num_ongoing = dict(ongoing)
            if sessions is not None:
                self.num_sessions = dict(sessions)
            if stats:
                self.no_replica_since = None
            elif self.no_replica_since is None:
                self.no_replica_since = now

    def seconds_without_replicas(self, now: float) -> float:
        """How long the router has had no replica to send to (0 while it has one)."""
        with self.lock:
            return 0.0 if self.no_replica_since is None else now - self.no_replica_since

    def count_decision(self, reason: Reason, replica_tag: str) -> None:
        with self.lock:
            self.decisions[(reason, replica_tag)] += 1

    def snapshot(self) -> BoardSnapshot:
        with self.lock:
            return BoardSnapshot(
                dict(self.replicas), dict(self.num_ongoing), dict(self.num_sessions), Counter(self.decisions)
            )


class BoardSnapshot(NamedTuple):
    replicas: dict[str, ReplicaStats]
    num_ongoing: dict[str, int]
    num_sessions: dict[str, int]
    decisions: Counter[tuple[Reason, str]]


BOARD = RoutingBoard()
