"""Which checkpoints `kvserve kv prune` removes (pure): the ones matching its filters, or,
with a budget, the server's own eviction order among them until the directory fits."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import NamedTuple

from kvserve.kvstore.eviction import DEFAULT_EVICTION_POLICY, EvictionPolicy, eviction_entries, plan_eviction
from kvserve.kvstore.inventory import Inventory, InventoryEntry

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


def parse_duration(text: str) -> float:
    """Seconds in "90s", "30m", "12h", "7d", "2w"; raises ValueError otherwise."""
    match = _DURATION.match(text.lower())
    if match is None:
        raise ValueError(f"bad duration {text!r}: use a number and a unit s, m, h, d or w (e.g. 7d)")
    return float(match.group(1)) * _UNITS[match.group(2)]


class PruneFilter(NamedTuple):
    older_than_s: float | None = None  # last used (or created) longer ago than this
    model: str | None = None  # model fingerprint prefix

    def matches(self, entry: InventoryEntry, now: float) -> bool:
        meta = entry.checkpoint.meta
        if self.model is not None and not meta.identity.fingerprint.startswith(self.model.lower()):
            return False
        used_at = meta.last_used or meta.created
        return self.older_than_s is None or now - used_at > self.older_than_s


class PrunePlan(NamedTuple):
    victim_ids: tuple[str, ...]
    fits: bool  # False: even removing every matching checkpoint leaves the directory over budget


def plan_prune(
    inventory: Inventory,
    now: float,
    budget_bytes: int | None,
    selection: PruneFilter,
    policy: EvictionPolicy = DEFAULT_EVICTION_POLICY,
) -> PrunePlan:
    """Without a budget, every matching checkpoint; with one, the lowest-scoring matching
    ones (the server's eviction policy, nothing protected but what does not match) until
    the readable checkpoints fit it. No victims when the budget cannot be met."""
    matching = {e.checkpoint_id for e in inventory.entries if selection.matches(e, now)}
    if budget_bytes is None:
        ordered = sorted(
            (e for e in inventory.entries if e.checkpoint_id in matching),
            key=lambda e: e.checkpoint.meta.last_used,
        )
        return PrunePlan(tuple(e.checkpoint_id for e in ordered), True)
    checkpoints = [entry.checkpoint for entry in inventory.entries]
    entries = [
        replace(entry, is_protected=entry.checkpoint_id not in matching)
        for entry in eviction_entries(checkpoints, now, {}, 0.0)
    ]
    used = inventory.chunk_users()
    chunk_sizes = {key: size for key, size in inventory.chunk_sizes.items() if key in used}
    plan = plan_eviction(entries, chunk_sizes, budget_bytes, now, None, policy)
    return PrunePlan(plan.victim_ids, plan.can_store)
