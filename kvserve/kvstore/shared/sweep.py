"""Eviction in the shared tier: the one place that deletes from it (`kvserve kv prune|rm|verify
--fix` against `--kv-shared-dir` / `--kv-s3-url`), run by one sweeper: a cron job, an operator.

Servers never evict from the shared store: each would need every other replica's view of what is
in use, and two servers' evictions would race with each other's writes. The sweeper picks victims
by the local tier's own policy (`prune.py`), and two rules keep it from deleting what a replica has
just written or still needs:
- Grace: no object younger than `grace_s` is deleted. A replica writes a checkpoint's chunks before
  its manifest, so for a moment those chunks belong to no manifest; the grace covers that moment
  (and a replica's temp files, on a shared directory, until the write is plainly dead).
- Second look: manifests go first, then the store is listed again and only chunks that no manifest
  of that second listing uses are deleted, so a checkpoint written during the sweep keeps its chunks.
What is left is a narrow race (a replica that found an old chunk present just before the sweeper
deleted it); it costs a miss, never wrong KV: a loader that finds a chunk missing deletes the
manifests that name it, and the request prefills.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from kvserve.kvstore.manifest import CorruptManifestError, IncompatibleManifestError, decode_manifest
from kvserve.kvstore.prune import PruneFilter, PrunePlan, Victim, plan_prune
from kvserve.kvstore.shared.dir_store import DirObjectStore
from kvserve.kvstore.shared.inventory import SharedScan, object_key
from kvserve.kvstore.shared.keys import manifest_key, parse_key
from kvserve.kvstore.shared.object_store import ObjectStore
from kvserve.kvstore.verify import VerifyReport

DEFAULT_GRACE_S = 3600.0


class SharedRemoval(NamedTuple):
    num_checkpoints: int
    num_chunks: int
    num_bytes: int
    num_young_kept: int  # unused chunks left for a later sweep: younger than the grace period


def is_young(scan: SharedScan, key: str, now: float, grace_s: float) -> bool:
    return now - scan.modified.get(key, now) < grace_s


def plan_shared_prune(
    scan: SharedScan, now: float, budget_bytes: int | None, selection: PruneFilter, grace_s: float
) -> PrunePlan:
    """`plan_prune` over the shared tier, without the checkpoints written within the grace period
    (`fits` is False when keeping them leaves the store over the budget)."""
    plan = plan_prune(scan.inventories, now, budget_bytes, selection)
    victims = tuple(
        v
        for v in plan.victims
        if not is_young(scan, manifest_key(v.inventory.directory.name, v.entry.checkpoint_id), now, grace_s)
    )
    return PrunePlan(victims, plan.fits and len(victims) == len(plan.victims))


def remove_shared(
    store: ObjectStore, scan: SharedScan, victims: Sequence[Victim], now: float, grace_s: float
) -> SharedRemoval:
    """Delete the victims' manifests, then the chunks no manifest uses any more (second look)."""
    doomed = set()
    for inventory, entry in victims:
        key = manifest_key(inventory.directory.name, entry.checkpoint_id)
        store.delete(key)
        doomed.add(key)
    num_bytes = sum(entry.checkpoint.manifest_bytes for _, entry in victims)
    chunks, chunk_bytes, young = sweep_unused_chunks(store, scan, now, grace_s, doomed)
    return SharedRemoval(len(victims), chunks, num_bytes + chunk_bytes, young)


def sweep_unused_chunks(
    store: ObjectStore, scan: SharedScan, now: float, grace_s: float, deleted: set[str] = frozenset()
) -> tuple[int, int, int]:
    """Delete chunks older than the grace period that no manifest in a fresh listing uses; returns
    (chunks deleted, bytes freed, unused chunks kept for their youth). Manifests the scan read are
    not read again (they are immutable); new ones are."""
    known = {
        manifest_key(inventory.directory.name, entry.checkpoint_id): {s.key for s in entry.checkpoint.chunks}
        for inventory in scan.inventories
        for entry in inventory.entries
    }
    used: set[tuple[str, str]] = set()
    chunks: list[tuple[str, str, str, int, float]] = []  # (object key, model, chunk key, size, modified)
    for info in store.list(""):
        parsed = parse_key(info.key)
        if parsed is None:
            continue
        if parsed.kind == "chunk":
            chunks.append((info.key, parsed.model, parsed.name, info.size, info.modified))
            continue
        if info.key in deleted:
            continue
        keys = known.get(info.key)
        if keys is None:
            keys = _chunk_keys(store, info.key)
        used.update((parsed.model, key) for key in keys)
    num_deleted = num_bytes = num_young = 0
    for key, model, name, size, modified in chunks:
        if (model, name) in used:
            continue
        if now - modified < grace_s:
            num_young += 1
            continue
        store.delete(key)
        num_deleted += 1
        num_bytes += size
    return num_deleted, num_bytes, num_young


def _chunk_keys(store: ObjectStore, key: str) -> set[str]:
    data = store.get(key)
    if data is None:
        return set()
    try:
        return {span.key for span in decode_manifest(data).chunks}
    except IncompatibleManifestError:
        return set()  # another version's: its chunks are named alike; keep them all below
    except CorruptManifestError:
        return set()


def fix_shared(
    store: ObjectStore, scan: SharedScan, reports: Sequence[VerifyReport], now: float, grace_s: float
) -> tuple[int, int]:
    """`kvserve kv verify --fix` on the shared tier: delete corrupt objects, and orphans and temp
    files older than the grace period (younger ones may be writes in progress). Manifests of another
    format version are left to the replicas of that version. Returns (deleted, kept for now)."""
    deleted = kept = 0
    for report in reports:
        for problem in sorted(report.problems, key=lambda p: p.path.parent.name != "checkpoints"):
            if problem.kind == "incompatible":
                kept += 1
                continue
            if problem.path.name.count(".tmp."):  # a temp file of a shared directory
                if isinstance(store, DirObjectStore) and now - problem.path.stat().st_mtime >= grace_s:
                    problem.path.unlink(missing_ok=True)
                    deleted += 1
                else:
                    kept += 1
                continue
            key = object_key(store, problem.path)
            if problem.kind == "orphan" and is_young(scan, key, now, grace_s):
                kept += 1
                continue
            store.delete(key)
            deleted += 1
    return deleted, kept
