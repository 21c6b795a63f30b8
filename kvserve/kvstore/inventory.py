"""Inventory: a read-only look at a cache directory, whatever models wrote it (for `kvserve kv`).

A CheckpointStore is bound to one model and removes entries in its subdirectory that are
not its own; the inventory instead reads every manifest as it is, so the CLI can list,
check and edit a directory without a model and without touching what it was not asked to.
`scan` reads one model subdirectory (or an old flat-layout root), `scan_all` every one.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from kvserve.kvstore.atomic_file import is_temp_file
from kvserve.kvstore.cache_dir import LOCK_NAME
from kvserve.kvstore.checkpoint import Checkpoint, StoreIdentity
from kvserve.kvstore.chunk_format import identity_digest
from kvserve.kvstore.chunk_store import SUFFIX as CHUNK_SUFFIX
from kvserve.kvstore.index import CheckpointIndex, IndexDamagedError
from kvserve.kvstore.layout import INDEX_NAME, MODEL_DIR_PATTERN, has_flat_layout, model_dirs
from kvserve.kvstore.manifest import (
    CorruptManifestError,
    IncompatibleManifestError,
    Manifest,
    decode_manifest,
)
from kvserve.kvstore.manifest_store import SUFFIX as MANIFEST_SUFFIX


@dataclass(frozen=True)
class InventoryEntry:
    """One readable checkpoint: its index-style record, exact tokens, and what deleting it frees."""

    checkpoint: Checkpoint
    token_ids: tuple[int, ...]
    marginal_bytes: int  # manifest + chunks no other checkpoint uses

    @property
    def checkpoint_id(self) -> str:
        return self.checkpoint.checkpoint_id


@dataclass(frozen=True)
class UnreadableManifest:
    checkpoint_id: str
    why: str
    is_incompatible: bool  # another format version (else corrupt)


@dataclass(frozen=True)
class Inventory:
    directory: Path
    entries: tuple[InventoryEntry, ...]
    unreadable: tuple[UnreadableManifest, ...]
    chunk_sizes: Mapping[str, int]  # every chunk file on disk
    manifest_sizes: Mapping[str, int]  # every manifest file on disk, readable or not
    num_temp_files: int
    index_identity_tag: str | None  # whose index.sqlite this is (the last server's identity)

    @property
    def total_bytes(self) -> int:
        return sum(self.manifest_sizes.values()) + sum(self.chunk_sizes.values())

    @property
    def logical_bytes(self) -> int:
        """What the checkpoints would take if each stored its own copy of every chunk."""
        return sum(entry.checkpoint.num_bytes for entry in self.entries)

    @property
    def dedup_ratio(self) -> float:
        return self.logical_bytes / self.total_bytes if self.total_bytes else 1.0

    def manifest_path(self, checkpoint_id: str) -> Path:
        return self.directory / "checkpoints" / f"{checkpoint_id}{MANIFEST_SUFFIX}"

    def chunk_path(self, key: str) -> Path:
        return self.directory / "chunks" / f"{key}{CHUNK_SUFFIX}"

    @property
    def is_flat_layout(self) -> bool:
        """An old single-model cache lying directly in the root (moved by the next server)."""
        return not self.model_dir_name

    @property
    def model_dir_name(self) -> str:
        """The model subdirectory's name (its identity's digest); "" for a flat-layout root."""
        return self.directory.name if MODEL_DIR_PATTERN.match(self.directory.name) else ""

    def current_identity(self) -> StoreIdentity | None:
        """The identity the directory belongs to: the one its name is the digest of, else the
        last server's (recorded in its index), else that of the most recently used checkpoint.
        Other identities' entries are incompatible."""
        identities = {entry.checkpoint.meta.identity for entry in self.entries}
        for tag in (self.model_dir_name, self.index_identity_tag):
            for identity in identities:
                if identity_digest(identity).hex() == tag:
                    return identity
        if not self.entries:
            return None
        return max(self.entries, key=lambda e: e.checkpoint.meta.last_used).checkpoint.meta.identity

    def find(self, id_prefix: str) -> list[InventoryEntry]:
        """Entries whose id starts with `id_prefix` (ids are 40 hex digits; a prefix will do)."""
        prefix = id_prefix.lower()
        return [entry for entry in self.entries if entry.checkpoint_id.startswith(prefix)]

    def chunk_users(self) -> Counter[str]:
        users: Counter[str] = Counter()
        for entry in self.entries:
            users.update({span.key for span in entry.checkpoint.chunks})
        return users


def _files(directory: Path, suffix: str) -> tuple[dict[str, int], int]:
    """Sizes of the complete `*suffix` files of a subdirectory by stem, and the temp file count."""
    sizes: dict[str, int] = {}
    num_temp = 0
    if not directory.is_dir():
        return sizes, 0
    for path in directory.iterdir():
        if is_temp_file(path):
            num_temp += 1
        elif path.name.endswith(suffix) and path.is_file():
            sizes[path.name[: -len(suffix)]] = path.stat().st_size
    return sizes, num_temp


def _index_identity_tag(path: Path) -> str | None:
    if not path.exists():
        return None
    try:
        # Read-only: a running server may hold the index open in WAL mode.
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            row = db.execute("SELECT value FROM meta WHERE key = 'identity'").fetchone()
        finally:
            db.close()
    except sqlite3.Error:
        return None
    return None if row is None else str(row[0])


def _read_manifest(path: Path) -> Manifest:
    manifest = decode_manifest(path.read_bytes())
    if f"{manifest.meta.checkpoint_id}{MANIFEST_SUFFIX}" != path.name:
        raise CorruptManifestError(f"names checkpoint {manifest.meta.checkpoint_id}")
    return manifest


def scan(directory: Path) -> Inventory:
    """Read every manifest of `directory` (not the KV: cheap) without changing anything.

    Raises FileNotFoundError if `directory` holds no cache (no `checkpoints` subdirectory).
    """
    if not (directory / "checkpoints").is_dir():
        raise FileNotFoundError(f"no KV cache in {directory}")
    manifest_sizes, num_temp_manifests = _files(directory / "checkpoints", MANIFEST_SUFFIX)
    chunk_sizes, num_temp_chunks = _files(directory / "chunks", CHUNK_SUFFIX)
    manifests: list[tuple[Manifest, int]] = []
    unreadable = []
    for checkpoint_id, size in sorted(manifest_sizes.items()):
        path = directory / "checkpoints" / f"{checkpoint_id}{MANIFEST_SUFFIX}"
        try:
            manifests.append((_read_manifest(path), size))
        except IncompatibleManifestError as error:
            unreadable.append(UnreadableManifest(checkpoint_id, str(error), is_incompatible=True))
        except (OSError, CorruptManifestError) as error:
            unreadable.append(UnreadableManifest(checkpoint_id, str(error), is_incompatible=False))
    users: Counter[str] = Counter()
    for manifest, _ in manifests:
        users.update({span.key for span in manifest.chunks})
    entries = tuple(entry_of(manifest, size, chunk_sizes, users) for manifest, size in manifests)
    return Inventory(
        directory,
        entries,
        tuple(unreadable),
        chunk_sizes,
        manifest_sizes,
        num_temp_manifests + num_temp_chunks,
        _index_identity_tag(directory / INDEX_NAME),
    )


def scan_all(root: Path) -> tuple[Inventory, ...]:
    """Every model subdirectory of `root`, and the root itself if it still has the old flat
    layout. Raises FileNotFoundError if `root` is not a cache directory (no lock file, no
    model subdirectory, no flat layout)."""
    inventories = [scan(d) for d in model_dirs(root) if (d / "checkpoints").is_dir()]
    if has_flat_layout(root):
        inventories.append(scan(root))
    if not inventories and not (root / LOCK_NAME).exists():
        raise FileNotFoundError(f"no KV cache in {root}")
    return tuple(inventories)


def entry_of(
    manifest: Manifest, manifest_bytes: int, chunk_sizes: Mapping[str, int], users: Counter[str]
) -> InventoryEntry:
    """An inventory entry of a manifest, given every chunk's size and user count (local or shared)."""
    keys = {span.key for span in manifest.chunks}
    chunk_bytes = sum(chunk_sizes.get(key, 0) for key in keys)
    own = sum(chunk_sizes.get(key, 0) for key in keys if users[key] == 1)
    checkpoint = Checkpoint(
        manifest.meta, tuple(manifest.chunks), manifest_bytes, manifest_bytes + chunk_bytes
    )
    return InventoryEntry(checkpoint, tuple(manifest.token_ids), manifest_bytes + own)


class Removal(NamedTuple):
    num_checkpoints: int
    num_chunks: int
    num_bytes: int


def remove_checkpoints(inventory: Inventory, checkpoint_ids: Collection[str]) -> Removal:
    """Delete checkpoints and the chunks no remaining checkpoint uses, then drop them from the
    index. The caller holds the directory's exclusive lock (no server is writing)."""
    doomed = [entry for entry in inventory.entries if entry.checkpoint_id in set(checkpoint_ids)]
    doomed_ids = {entry.checkpoint_id for entry in doomed}
    kept_keys = {
        span.key
        for entry in inventory.entries
        if entry.checkpoint_id not in doomed_ids
        for span in entry.checkpoint.chunks
    }
    freed_keys = {span.key for entry in doomed for span in entry.checkpoint.chunks} - kept_keys
    # Manifests first: once one is gone its checkpoint no longer exists, whatever else fails.
    for entry in doomed:
        inventory.manifest_path(entry.checkpoint_id).unlink(missing_ok=True)
    for key in freed_keys:
        inventory.chunk_path(key).unlink(missing_ok=True)
    _drop_from_index(inventory, doomed_ids)
    num_bytes = sum(e.checkpoint.manifest_bytes for e in doomed)
    num_bytes += sum(inventory.chunk_sizes.get(key, 0) for key in freed_keys)
    return Removal(len(doomed), len(freed_keys), num_bytes)


def _drop_from_index(inventory: Inventory, checkpoint_ids: Collection[str]) -> None:
    """Keep the server's index in step; if it is not this identity's or unusable, the server
    notices at open (index and files disagree) and rebuilds it from the files."""
    identity = inventory.current_identity()
    path = inventory.directory / INDEX_NAME
    if identity is None or inventory.index_identity_tag is None or not path.exists():
        return
    try:
        index = CheckpointIndex(path, identity, inventory.index_identity_tag)
    except IndexDamagedError:
        return
    try:
        for checkpoint_id in checkpoint_ids:
            index.remove(checkpoint_id)
    finally:
        index.close()
