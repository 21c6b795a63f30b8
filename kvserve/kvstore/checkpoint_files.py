"""CheckpointFiles: the files and index of one cache directory, kept consistent.

Every mutation that spans files and index lives here (add, delete, remove-if-corrupt), in
an order that a crash at any point leaves something the next open repairs: chunks before
the manifest that names them, the manifest before the index; on delete, the manifest first.
NOTE: not thread-safe; CheckpointStore calls it under its lock (chunk writes excepted: new
chunk files are referenced by nothing until their manifest is added).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import torch

from kvserve.env import switches
from kvserve.kvstore.atomic_file import ensure_private_dir
from kvserve.kvstore.checkpoint import CheckpointMeta, ChunkSpan, LoadedKV, StoreIdentity
from kvserve.kvstore.chunk_format import CorruptChunkError, identity_digest
from kvserve.kvstore.chunk_store import ChunkStore
from kvserve.kvstore.disk_errors import DiskErrorLog
from kvserve.kvstore.manifest import (
    CorruptManifestError,
    IncompatibleManifestError,
    Manifest,
    encode_manifest,
)
from kvserve.kvstore.manifest_store import ManifestStore
from kvserve.kvstore.recovery import open_index

logger = logging.getLogger(__name__)

# Called by save() for each chunk not stored yet: per-layer KV [2, num_tokens, num_kv_heads, head_dim].
ChunkProvider = Callable[[ChunkSpan], Sequence[torch.Tensor]]


def _crash_window() -> None:
    """KVSERVE_KV_WRITE_DELAY_MS: widen the gap between two steps of a write or delete, so that the
    crash harness's kill -9 lands between them often (0, the default, costs one attribute read)."""
    delay_ms = switches().kv_write_delay_ms
    if delay_ms:
        time.sleep(delay_ms / 1000)


class ChunkUnavailableError(LookupError):
    """Raised by a ChunkProvider that no longer holds a chunk's KV: the engine copies out only
    the chunks missing when it submits, and one may be evicted before the save runs."""


class CheckpointFiles:
    def __init__(self, directory: Path, identity: StoreIdentity) -> None:
        ensure_private_dir(directory)
        self.identity = identity
        self.manifests = ManifestStore(directory / "checkpoints", identity)
        self.chunks = ChunkStore(directory / "chunks", identity)
        tag = identity_digest(identity).hex()
        self.index = open_index(directory / "index.sqlite", tag, self.manifests, self.chunks)
        self.num_corrupt_removed = 0
        self.disk_errors = DiskErrorLog(directory)

    def close(self) -> None:
        self.index.close()

    def write_chunks(
        self, spans: Sequence[ChunkSpan], token_ids: Sequence[int], provider: ChunkProvider
    ) -> set[str]:
        """Write chunks that are not stored (nor referenced) yet; all or none stay on disk."""
        written: set[str] = set()
        try:
            for span in spans:
                self.chunks.write(span, token_ids[span.start : span.end], provider(span))
                written.add(span.key)
                _crash_window()
            if spans:
                self.chunks.sync()
        except BaseException:
            self.discard_chunks(written)
            raise
        return written

    def discard_chunks(self, keys: Collection[str]) -> None:
        """Delete chunk files of a failed save (never indexed, so no manifest uses them)."""
        for key in keys:
            self.chunks.delete(key)

    def add(
        self, meta: CheckpointMeta, manifest: bytes, spans: Sequence[ChunkSpan], sizes: dict[str, int]
    ) -> None:
        """Commit a checkpoint whose chunks are all on disk: manifest file, then index."""
        self.manifests.write(meta.checkpoint_id, manifest)
        _crash_window()
        try:
            self.index.add(meta, spans, len(manifest), sizes)
        except BaseException:
            self.manifests.delete(meta.checkpoint_id)  # never a manifest the index does not know
            raise

    def rewrite_manifest(self, meta: CheckpointMeta, token_ids: Sequence[int]) -> None:
        """Persist new bookkeeping (hits, last_used) in the manifest, then the index.

        A failure (disk full) only loses the bookkeeping: it is logged, not raised.
        """
        checkpoint = self.index.get(meta.checkpoint_id)
        assert checkpoint is not None
        data = encode_manifest(meta, token_ids, checkpoint.chunks)
        try:
            self.manifests.write(meta.checkpoint_id, data)
            self.index.update_usage(meta.checkpoint_id, meta.last_used, meta.hits, len(data))
        except OSError as error:
            self.disk_errors.failed(f"bookkeeping of checkpoint {meta.checkpoint_id}", error)

    def delete(self, checkpoint_id: str) -> bool:
        # Manifest first: once it is gone the checkpoint no longer exists, whatever else fails.
        existed = self.manifests.delete(checkpoint_id) or self.index.get(checkpoint_id) is not None
        _crash_window()
        for key in self.index.remove(checkpoint_id):
            self.chunks.delete(key)
        return existed

    def remove_corrupt(self, checkpoint_id: str, why: str) -> None:
        logger.warning("kvstore: removing checkpoint %s: %s", checkpoint_id, why)
        self.num_corrupt_removed += 1
        try:
            self.delete(checkpoint_id)
        except OSError as error:  # read-only directory: at least never offer it again
            self.disk_errors.failed(f"removing checkpoint {checkpoint_id}", error)
            with contextlib.suppress(OSError):  # already reported just above
                self.index.remove(checkpoint_id)

    def read_manifest(self, checkpoint_id: str) -> Manifest | None:
        """The verified manifest of an indexed checkpoint; None (and removed) if it is bad."""
        if self.index.get(checkpoint_id) is None:
            return None
        try:
            return self.manifests.read(checkpoint_id)
        except (OSError, CorruptManifestError, IncompatibleManifestError) as error:
            self.remove_corrupt(checkpoint_id, str(error))
            return None

    def read_run(self, spans: Sequence[ChunkSpan]) -> LoadedKV | None:
        """Verified KV of consecutive chunks; None if one is bad (it and its users are removed)."""
        try:
            return self.chunks.read_run(spans)
        except CorruptChunkError as error:
            for user in self.index.users_of(error.key):
                self.remove_corrupt(user, str(error))
            self.chunks.delete(error.key)
            return None

    def read_checkpoint(self, checkpoint_id: str) -> tuple[Manifest, LoadedKV] | None:
        """A checkpoint's manifest and fully verified KV; None if gone or corrupt (then removed)."""
        manifest = self.read_manifest(checkpoint_id)
        if manifest is None:
            return None
        loaded = self.read_run(manifest.chunks)
        if loaded is None:
            return None
        if list(loaded.token_ids) != manifest.token_ids:
            self.remove_corrupt(checkpoint_id, "its chunks hold other tokens")
            return None
        return manifest, loaded
