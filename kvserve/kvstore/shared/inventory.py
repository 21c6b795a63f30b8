"""The shared tier as `kvserve kv` sees it: the local inventory's records (`kvstore/inventory.py`),
built from an object listing and the manifests, plus each object's time (for the sweeper's grace)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import NamedTuple

from kvserve.kvstore.checkpoint import ChunkSpan, StoreIdentity
from kvserve.kvstore.chunk_format import CorruptChunkError, decode_chunk
from kvserve.kvstore.inventory import Inventory, UnreadableManifest, entry_of
from kvserve.kvstore.manifest import (
    CorruptManifestError,
    IncompatibleManifestError,
    Manifest,
    decode_manifest,
)
from kvserve.kvstore.shared.dir_store import DirObjectStore
from kvserve.kvstore.shared.keys import chunk_key, parse_key
from kvserve.kvstore.shared.object_store import ObjectStore
from kvserve.kvstore.verify import ReadChunkTokens


class SharedScan(NamedTuple):
    inventories: tuple[Inventory, ...]  # one per model; `directory` names the model's key prefix
    modified: dict[str, float]  # object key -> when it was written (the store's clock)


def model_directory(store: ObjectStore, model: str) -> Path:
    """Where a model's objects are, as the inventory names them: a real directory for a shared
    directory (so its temp files are found too), else the key prefix."""
    return store.root / model if isinstance(store, DirObjectStore) else Path(model)


def scan_shared(store: ObjectStore) -> SharedScan:
    """List the store and read every manifest (not the chunks). Raises ObjectStoreError."""
    manifests: dict[str, dict[str, int]] = {}
    chunks: dict[str, dict[str, int]] = {}
    modified: dict[str, float] = {}
    for info in store.list(""):
        parsed = parse_key(info.key)
        if parsed is None:
            continue
        modified[info.key] = info.modified
        sizes = manifests if parsed.kind == "manifest" else chunks
        sizes.setdefault(parsed.model, {})[parsed.name] = info.size
        chunks.setdefault(parsed.model, {})
    inventories = []
    for model in sorted(chunks):
        read: list[tuple[Manifest, int]] = []
        unreadable = []
        for checkpoint_id, size in sorted(manifests.get(model, {}).items()):
            try:
                manifest = _manifest(store, model, checkpoint_id)
            except IncompatibleManifestError as error:
                unreadable.append(UnreadableManifest(checkpoint_id, str(error), is_incompatible=True))
                continue
            except CorruptManifestError as error:
                unreadable.append(UnreadableManifest(checkpoint_id, str(error), is_incompatible=False))
                continue
            if manifest is not None:
                read.append((manifest, size))
        users: Counter[str] = Counter()
        for manifest, _ in read:
            users.update({span.key for span in manifest.chunks})
        entries = tuple(entry_of(manifest, size, chunks[model], users) for manifest, size in read)
        directory = model_directory(store, model)
        inventories.append(
            Inventory(
                directory, entries, tuple(unreadable), chunks[model], manifests.get(model, {}), 0, model
            )
        )
    return SharedScan(tuple(inventories), modified)


def _manifest(store: ObjectStore, model: str, checkpoint_id: str) -> Manifest | None:
    data = store.get(f"{model}/checkpoints/{checkpoint_id}.kvm")
    if data is None:  # deleted since the listing
        return None
    manifest = decode_manifest(data)
    if manifest.meta.checkpoint_id != checkpoint_id:
        raise CorruptManifestError(f"names checkpoint {manifest.meta.checkpoint_id}")
    return manifest


def chunk_reader(store: ObjectStore) -> ReadChunkTokens:
    """`kvserve kv verify`'s chunk reader over the store: every chunk read and hash-checked."""

    def read(identity: StoreIdentity, span: ChunkSpan) -> list[int]:
        data = store.get(chunk_key(identity, span.key))
        if data is None:
            raise CorruptChunkError("missing")
        return decode_chunk(bytearray(data), identity, span)[0]

    return read


def object_key(store: ObjectStore, path: Path) -> str:
    """The object key of a path an Inventory or VerifyReport names."""
    if isinstance(store, DirObjectStore):
        return path.relative_to(store.root).as_posix()
    return path.as_posix()
