"""Formatting for `kvserve kv`: sizes, ages, and one checkpoint as a JSON-ready record."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.console import Console

from kvserve.kvstore.eviction import DEFAULT_EVICTION_POLICY, effective_hits

if TYPE_CHECKING:
    from kvserve.kvstore.inventory import Inventory, InventoryEntry


def size(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if num_bytes < 1024 or unit == "GiB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    raise AssertionError


def ago(when: float, now: float) -> str:
    seconds = max(0.0, now - when)
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length:
            return f"{seconds // length:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def iso(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


_SHORT_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}


def model(entry: InventoryEntry) -> str:
    identity = entry.checkpoint.meta.identity
    return f"{identity.fingerprint[:10]}/{_SHORT_DTYPES.get(identity.dtype, identity.dtype)}"


def console() -> Console:
    # Piped output keeps whole rows (rich would wrap every cell at 80 columns).
    return Console(width=None if sys.stdout.isatty() else 160)


def record(entry: InventoryEntry, now: float) -> dict[str, Any]:
    meta = entry.checkpoint.meta
    identity = meta.identity
    return {
        "id": entry.checkpoint_id,
        "reason": meta.reason,
        "num_tokens": meta.num_tokens,
        "text_sha1": meta.text.sha1,
        "text_bytes": meta.text.num_bytes,
        "marginal_bytes": entry.marginal_bytes,
        "total_bytes": entry.checkpoint.num_bytes,
        "manifest_bytes": entry.checkpoint.manifest_bytes,
        "num_chunks": len(entry.checkpoint.chunks),
        "hits": meta.hits,
        "effective_hits": effective_hits(
            meta.hits, meta.last_used, meta.created, now, DEFAULT_EVICTION_POLICY
        ),
        "created": meta.created,
        "last_used": meta.last_used,
        "model_fingerprint": identity.fingerprint,
        "dtype": identity.dtype,
        "layout": {k: getattr(identity, k) for k in ("num_layers", "num_kv_heads", "head_dim", "block_size")},
    }


def totals(inventories: Sequence[Inventory]) -> dict[str, Any]:
    """Sums over model subdirectories (each chunk is stored in one of them only)."""
    on_disk = sum(inventory.total_bytes for inventory in inventories)
    logical = sum(inventory.logical_bytes for inventory in inventories)
    return {
        "num_checkpoints": sum(len(inventory.entries) for inventory in inventories),
        "bytes_on_disk": on_disk,
        "num_unique_chunks": sum(len(inventory.chunk_sizes) for inventory in inventories),
        "logical_bytes": logical,
        "dedup_ratio": round(logical / on_disk if on_disk else 1.0, 3),
        "num_unreadable_manifests": sum(len(inventory.unreadable) for inventory in inventories),
    }


def model_summary(inventory: Inventory) -> dict[str, Any]:
    """One model subdirectory: whose it is and what it holds."""
    identity = inventory.current_identity()
    return {
        "model_dir": inventory.model_dir_name or ".",
        "flat_layout": inventory.is_flat_layout,
        "model_fingerprint": None if identity is None else identity.fingerprint,
        "dtype": None if identity is None else identity.dtype,
        "num_checkpoints": len(inventory.entries),
        "bytes_on_disk": inventory.total_bytes,
    }
