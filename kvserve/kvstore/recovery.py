"""Opening a cache directory: reuse the index if it agrees with the files, else rebuild it
from the files, deleting whatever is corrupt, incompatible, orphaned or half-written."""

from __future__ import annotations

import logging
from pathlib import Path

from kvserve.kvstore.atomic_file import remove_temp_files
from kvserve.kvstore.chunk_format import CorruptChunkError
from kvserve.kvstore.chunk_store import ChunkStore
from kvserve.kvstore.index import CheckpointIndex, IndexDamagedError
from kvserve.kvstore.manifest import CorruptManifestError, IncompatibleManifestError
from kvserve.kvstore.manifest_store import ManifestStore

logger = logging.getLogger(__name__)


def open_index(
    path: Path, identity_tag: str, manifests: ManifestStore, chunks: ChunkStore
) -> CheckpointIndex:
    """The index for this directory, rebuilt if missing, damaged or out of step with the files."""
    removed = remove_temp_files(manifests.directory) + remove_temp_files(chunks.directory)
    if removed:
        logger.info("kvstore: removed %d leftover temp files of interrupted writes", removed)
    if path.exists():
        try:
            index = CheckpointIndex(path, manifests.identity, identity_tag)
            in_step = (
                index.checkpoint_ids() == manifests.ids_on_disk()
                and set(index.chunk_bytes()) == chunks.keys_on_disk()
            )
            if in_step:
                return index
            index.close()
            logger.warning("kvstore: index out of step with the files; rebuilding")
        except IndexDamagedError as error:
            logger.warning("kvstore: index unusable (%s); rebuilding from the files", error)
    return rebuild_index(path, identity_tag, manifests, chunks)


def rebuild_index(
    path: Path, identity_tag: str, manifests: ManifestStore, chunks: ChunkStore
) -> CheckpointIndex:
    index = CheckpointIndex.create(path, manifests.identity, identity_tag)
    num_removed = 0
    for checkpoint_id in sorted(manifests.ids_on_disk()):
        if not _index_manifest(index, checkpoint_id, manifests, chunks):
            manifests.delete(checkpoint_id)
            num_removed += 1
    referenced = set(index.chunk_bytes())
    orphans = chunks.keys_on_disk() - referenced
    for key in orphans:
        chunks.delete(key)
    logger.info(
        "kvstore: index rebuilt: %d checkpoints, %d chunks; removed %d checkpoints, %d orphan chunks",
        len(index.checkpoint_ids()),
        len(referenced),
        num_removed,
        len(orphans),
    )
    return index


def _index_manifest(
    index: CheckpointIndex, checkpoint_id: str, manifests: ManifestStore, chunks: ChunkStore
) -> bool:
    """Add one manifest to the index; False if it must be removed."""
    try:
        manifest = manifests.read(checkpoint_id)
        chunk_bytes = {span.key: chunks.check(span) for span in manifest.chunks}
    except (CorruptManifestError, IncompatibleManifestError, CorruptChunkError) as error:
        # A bad chunk fails every manifest using it; the orphan sweep then deletes it.
        logger.warning("kvstore: removing checkpoint %s: %s", checkpoint_id, error)
        return False
    index.add(manifest.meta, manifest.chunks, manifests.path(checkpoint_id).stat().st_size, chunk_bytes)
    return True
