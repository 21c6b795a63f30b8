"""Which checkpoints `kvserve kv prune` removes (pure): the ones matching its filters, or,
with a budget, the server's own eviction order among them (across every model's
subdirectory) until the whole directory fits."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

from kvserve.kvstore.eviction import DEFAULT_EVICTION_POLICY, EvictionPolicy, eviction_entries, plan_eviction

# Types only: the inventory imports the whole store; `kvserve kv`'s flags need parse_duration.
if TYPE_CHECKING:
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


class Victim(NamedTuple):
    inventory: Inventory  # the model subdirectory it lives in
    entry: InventoryEntry


class PrunePlan(NamedTuple):
    victims: tuple[Victim, ...]
    fits: bool  # False: even removing every matching checkpoint leaves the directory over budget


def plan_prune(
    inventories: Sequence[Inventory],
    now: float,
    budget_bytes: int | None,
    selection: PruneFilter,
    policy: EvictionPolicy = DEFAULT_EVICTION_POLICY,
) -> PrunePlan:
    """Without a budget, every matching checkpoint; with one, the lowest-scoring matching
    ones of any model (the server's eviction policy, nothing protected but what does not
    match) until the readable checkpoints of the whole directory fit it. No victims when
    the budget cannot be met."""
    # Ids and chunk keys are unique within one model subdirectory only: namespace them.
    by_key = {
        f"{i}/{entry.checkpoint_id}": Victim(inventory, entry)
        for i, inventory in enumerate(inventories)
        for entry in inventory.entries
    }
    matching = {key for key, victim in by_key.items() if selection.matches(victim.entry, now)}
    if budget_bytes is None:
        ordered = sorted(matching, key=lambda key: by_key[key].entry.checkpoint.meta.last_used)
        return PrunePlan(tuple(by_key[key] for key in ordered), True)
    entries = []
    chunk_sizes: dict[str, int] = {}
    for i, inventory in enumerate(inventories):
        for entry in eviction_entries([e.checkpoint for e in inventory.entries], now, {}, 0.0):
            key = f"{i}/{entry.checkpoint_id}"
            chunk_keys = frozenset(f"{i}/{chunk}" for chunk in entry.chunk_keys)
            entries.append(
                replace(entry, checkpoint_id=key, chunk_keys=chunk_keys, is_protected=key not in matching)
            )
        used = inventory.chunk_users()
        chunk_sizes |= {f"{i}/{key}": size for key, size in inventory.chunk_sizes.items() if key in used}
    plan = plan_eviction(entries, chunk_sizes, budget_bytes, now, None, policy)
    return PrunePlan(tuple(by_key[key] for key in plan.victim_ids), plan.can_store)
