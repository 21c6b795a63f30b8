"""Requests in flight per replica, as the router counts them: from the moment it picks a replica (so a
burst of new sessions arriving together spreads, rather than all seeing the same idle replica) until
Ray says the request finished. Pure; time comes in as `now`."""

from __future__ import annotations

from typing import NamedTuple

# A pick that Ray never confirms (the request was cancelled while waiting for a replica) stops
# counting after this long.
PROVISIONAL_TTL_S = 30.0


class _Entry(NamedTuple):
    replica_id: str
    is_confirmed: bool
    since: float


class InFlight:
    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def chosen(self, request_id: str, replica_id: str, now: float) -> None:
        """The policy picked `replica_id` (Ray may still send the request elsewhere)."""
        self._entries[request_id] = _Entry(replica_id, False, now)

    def routed(self, request_id: str, replica_id: str, now: float) -> None:
        self._entries[request_id] = _Entry(replica_id, True, now)

    def finished(self, request_id: str) -> None:
        self._entries.pop(request_id, None)

    def forget_replica(self, replica_id: str) -> None:
        for request_id in [k for k, e in self._entries.items() if e.replica_id == replica_id]:
            del self._entries[request_id]

    def counts(self, now: float) -> dict[str, int]:
        for request_id in [
            k for k, e in self._entries.items() if not e.is_confirmed and now - e.since > PROVISIONAL_TTL_S
        ]:
            del self._entries[request_id]
        counts: dict[str, int] = {}
        for entry in self._entries.values():
            counts[entry.replica_id] = counts.get(entry.replica_id, 0) + 1
        return counts
