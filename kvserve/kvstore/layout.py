"""The layout of a cache directory: one subdirectory per model, so models never evict or
delete each other's checkpoints.

    <root>/lock                       shared by servers, exclusive for `kvserve kv` edits
    <root>/<identity digest>/         one model + dtype + KV layout (StoreIdentity):
        checkpoints/ chunks/ index.sqlite
        tool_memory.json              that model's server's exact tool replay memory

The subdirectory's name is the 32-hex-digit digest of the identity (the tag its index
records), so a store finds its own without reading anything, and `kvserve kv` knows which
identity a subdirectory is for. Before per-model subdirectories the files lay directly in
the root (the "flat" layout); `migrate_flat_layout` moves them into place.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

from kvserve.kvstore.atomic_file import ensure_private_dir, is_temp_file
from kvserve.kvstore.checkpoint import StoreIdentity
from kvserve.kvstore.chunk_format import identity_digest
from kvserve.kvstore.manifest import CorruptManifestError, IncompatibleManifestError, decode_manifest

logger = logging.getLogger(__name__)

CHECKPOINTS, CHUNKS, INDEX_NAME = "checkpoints", "chunks", "index.sqlite"
MANIFEST_SUFFIX, CHUNK_SUFFIX = ".kvm", ".kvc"
MODEL_DIR_PATTERN = re.compile(r"^[0-9a-f]{32}$")


def model_dir_name(identity: StoreIdentity) -> str:
    return identity_digest(identity).hex()


def model_dir(root: Path, identity: StoreIdentity) -> Path:
    return root / model_dir_name(identity)


def model_dirs(root: Path) -> list[Path]:
    """The per-model subdirectories of `root` (sorted), whoever wrote them."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if MODEL_DIR_PATTERN.match(p.name) and p.is_dir())


def has_flat_layout(root: Path) -> bool:
    return (root / CHECKPOINTS).is_dir()


def stored_bytes(directory: Path) -> int:
    """Bytes of a model directory's manifests and chunks (what the budget counts; the index
    and temp files are not counted, as in the store's own total)."""
    total = 0
    for sub in (CHECKPOINTS, CHUNKS):
        try:
            with os.scandir(directory / sub) as entries:
                for entry in entries:
                    if not is_temp_file(Path(entry.name)):
                        try:
                            total += entry.stat().st_size
                        except FileNotFoundError:  # deleted meanwhile by its own server
                            pass
        except FileNotFoundError:
            continue
    return total


def other_models_bytes(root: Path, own: Path) -> int:
    """What the other models' subdirectories (and a not yet migrated flat layout) take."""
    total = sum(stored_bytes(d) for d in model_dirs(root) if d != own)
    return total + (stored_bytes(root) if has_flat_layout(root) else 0)


def migrate_flat_layout(root: Path) -> int:
    """Move a flat-layout cache into per-model subdirectories; returns checkpoints moved.

    The caller holds `<root>/lock` exclusively (no server is using the directory). Crash
    safe: each manifest's chunks are renamed before the manifest, so an interruption leaves
    complete checkpoints in either place (the rest is finished by the next call). Unreadable
    manifests, chunks no manifest uses, temp files and the old index are deleted; the
    subdirectories' indexes are rebuilt from their files when their stores open.
    """
    if not has_flat_layout(root):
        return 0
    old_manifests, old_chunks = root / CHECKPOINTS, root / CHUNKS
    num_moved = 0
    for path in sorted(old_manifests.iterdir()):
        if is_temp_file(path) or not path.name.endswith(MANIFEST_SUFFIX):
            continue
        try:
            manifest = decode_manifest(path.read_bytes())
        except (OSError, CorruptManifestError, IncompatibleManifestError) as error:
            logger.warning("kvstore: dropping unreadable old-layout checkpoint %s: %s", path.name, error)
            path.unlink(missing_ok=True)
            continue
        target = model_dir(root, manifest.meta.identity)
        ensure_private_dir(target / CHUNKS)
        ensure_private_dir(target / CHECKPOINTS)
        for span in manifest.chunks:
            source = old_chunks / f"{span.key}{CHUNK_SUFFIX}"
            if source.exists():
                os.replace(source, target / CHUNKS / source.name)
        os.replace(path, target / CHECKPOINTS / path.name)
        num_moved += 1
    # What is left is referenced by no manifest: orphan chunks, temp files, the old index.
    shutil.rmtree(old_manifests, ignore_errors=True)
    shutil.rmtree(old_chunks, ignore_errors=True)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{root / INDEX_NAME}{suffix}").unlink(missing_ok=True)
    logger.info("kvstore: moved %d checkpoints of %s into per-model subdirectories", num_moved, root)
    return num_moved
