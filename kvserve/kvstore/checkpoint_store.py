"""CheckpointStore: the disk tier of one model and KV layout, in its subdirectory of a cache
directory (`layout.py`); other models' subdirectories are never touched.

    <root>/<model>/checkpoints/<text sha1>.kvm   manifests (metadata, exact tokens, chunk list)
    <root>/<model>/chunks/<chain hash>.kvc       content-addressed KV chunks, shared between manifests
    <root>/<model>/index.sqlite                  derived index (rebuilt from the files when needed)

The budget bounds the whole root: other models' bytes count against it, but only this
model's checkpoints are evicted (a store that cannot fit beside them is skipped).
Thread-safe: the background writer saves while the engine thread looks up and loads.
NOTE: one server per model subdirectory; opening it deletes other processes' temp files in
it. A store holds a shared lock on the root so `kvserve kv` never edits it under a server.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from kvserve.kvstore.atomic_file import ensure_private_dir
from kvserve.kvstore.cache_dir import CacheDirBusyError, DirLock
from kvserve.kvstore.checkpoint import (
    Checkpoint,
    CheckpointMeta,
    ChunkRun,
    ChunkSpan,
    LoadedKV,
    SaveResult,
    StoreIdentity,
    StoreStats,
)
from kvserve.kvstore.checkpoint_files import CheckpointFiles, ChunkProvider, ChunkUnavailableError
from kvserve.kvstore.chunk_format import chunk_file_size
from kvserve.kvstore.chunking import chunk_spans, longest_stored_run, prefix_key
from kvserve.kvstore.disk_errors import check_free_space
from kvserve.kvstore.eviction import (
    DEFAULT_EVICTION_POLICY,
    EvictionPlan,
    EvictionPolicy,
    IncomingStore,
    ScoredEntry,
    eviction_entries,
    plan_eviction,
    score_entries,
)
from kvserve.kvstore.layout import has_flat_layout, migrate_flat_layout, model_dir, other_models_bytes
from kvserve.kvstore.manifest import Manifest, encode_manifest
from kvserve.kvstore.names import is_checkpoint_id
from kvserve.kvstore.text_prefix import longest_text_prefix

__all__ = ["CheckpointStore", "ChunkProvider", "ChunkUnavailableError", "ExportedCheckpoint"]

logger = logging.getLogger(__name__)


class ExportedCheckpoint(NamedTuple):
    manifest: Manifest
    manifest_bytes: bytes
    chunk_paths: dict[str, Path]  # chunk key -> its file


class CheckpointStore:
    def __init__(
        self,
        directory: Path,
        identity: StoreIdentity,
        budget_bytes: int,
        *,
        chunk_tokens: int = 256,
        policy: EvictionPolicy = DEFAULT_EVICTION_POLICY,
        protect_loaded_s: float = 600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        assert chunk_tokens > 0 and chunk_tokens % identity.block_size == 0, "chunks are whole blocks"
        self.identity = identity
        self.budget_bytes = budget_bytes
        self.chunk_tokens = chunk_tokens
        self.policy = policy
        self.protect_loaded_s = protect_loaded_s
        self._clock = clock
        ensure_private_dir(directory)
        _migrate_if_idle(directory)
        self.root = directory
        self.directory = model_dir(directory, identity)
        self._dir_lock = DirLock.shared_if_possible(directory)
        try:
            self._files = CheckpointFiles(self.directory, identity)
        except BaseException:
            self._release_lock()
            raise
        self._index = self._files.index
        self._lock = threading.RLock()  # index + file mutations
        self._save_lock = threading.Lock()  # one save at a time (chunk writes run outside _lock)
        self._loaded_at: dict[str, float] = {}
        self._num_loads = self._num_evictions = 0
        self._is_crowded = False  # other models' checkpoints left no room (warned once)
        self.evict_to_budget()

    def close(self) -> None:
        with self._lock:
            self._files.close()
            self._release_lock()

    def _release_lock(self) -> None:
        if self._dir_lock is not None:
            self._dir_lock.release()
            self._dir_lock = None

    def save(
        self,
        meta: CheckpointMeta,
        token_ids: Sequence[int],
        block_hashes: Sequence[int],
        provider: ChunkProvider,
    ) -> SaveResult:
        """Store a checkpoint, writing only the chunks not stored yet (evicting first if needed).

        `block_hashes` are the engine's chain hashes of the full blocks of `token_ids` (at
        least num_tokens // block_size of them). A disk error (full, read-only) skips the
        store with status "failed"; it is logged once per run of errors, never raised.
        """
        try:
            result = self._save(meta, token_ids, block_hashes, provider)
        except OSError as error:
            self._files.disk_errors.failed(f"{meta.reason} checkpoint {meta.checkpoint_id}", error)
            return SaveResult("failed", meta.checkpoint_id)
        if result.status == "stored":
            self._files.disk_errors.succeeded()
            # NOTE: logged once the manifest and the index are durable: a checkpoint this line
            # names survives a kill -9 unless a later line says it was evicted or deleted.
            logger.info(
                "kvstore: stored %s checkpoint %s (%d tokens, %d new chunks, %.1f MiB)",
                meta.reason,
                result.checkpoint_id,
                meta.num_tokens,
                result.num_new_chunks,
                result.num_new_bytes / 2**20,
            )
        return result

    def _save(
        self,
        meta: CheckpointMeta,
        token_ids: Sequence[int],
        block_hashes: Sequence[int],
        provider: ChunkProvider,
    ) -> SaveResult:
        checkpoint_id = meta.checkpoint_id
        if meta.identity != self.identity or meta.num_tokens != len(token_ids) or not token_ids:
            return SaveResult("incompatible", checkpoint_id)
        identity = self.identity
        spans = chunk_spans(
            token_ids, block_hashes, identity.block_size, self.chunk_tokens, identity.fingerprint
        )
        manifest = encode_manifest(meta, token_ids, spans)
        sizes = {s.key: chunk_file_size(identity, s.num_tokens) for s in spans}
        with self._save_lock:
            with self._lock:
                if self._index.get(checkpoint_id) is not None:
                    return SaveResult("exists", checkpoint_id)
                missing = [s for s in spans if s not in self._index.stored_spans(spans)]
                new_bytes = len(manifest) + sum(sizes[s.key] for s in missing)
                num_bytes = len(manifest) + sum(sizes.values())
                incoming = IncomingStore(checkpoint_id, num_bytes, new_bytes, frozenset(sizes))
                plan = self._evict(incoming, token_ids, block_hashes)
                if not plan.can_store:
                    return SaveResult(plan.outcome, checkpoint_id)
                check_free_space(self.directory, new_bytes)
            try:
                self._write_and_add(meta, manifest, token_ids, spans, missing, sizes, provider)
            except ChunkUnavailableError:
                return SaveResult("unavailable", checkpoint_id, evicted_ids=plan.victim_ids)
        return SaveResult("stored", checkpoint_id, len(missing), new_bytes, plan.victim_ids)

    def _write_and_add(
        self,
        meta: CheckpointMeta,
        manifest: bytes,
        token_ids: Sequence[int],
        spans: Sequence[ChunkSpan],
        missing: Sequence[ChunkSpan],
        sizes: dict[str, int],
        provider: ChunkProvider,
    ) -> None:
        # New chunk files are referenced by nothing yet, so no lock is needed to write them.
        written = self._files.write_chunks(missing, token_ids, provider)
        with self._lock:
            try:
                # A chunk counted as stored may have been deleted meanwhile (delete, corruption).
                stored_now = self._index.stored_spans(spans)
                late = [s for s in spans if s.key not in written and s not in stored_now]
                written |= self._files.write_chunks(late, token_ids, provider)
                self._files.add(meta, manifest, spans, sizes)
            except BaseException:
                self._files.discard_chunks(written)
                raise

    def missing_spans(self, token_ids: Sequence[int], block_hashes: Sequence[int]) -> list[ChunkSpan]:
        """The chunks of this prefix not stored yet: all the engine needs to copy out for a save
        (if one is evicted before the save runs, the provider raises ChunkUnavailableError)."""
        identity = self.identity
        spans = chunk_spans(
            token_ids, block_hashes, identity.block_size, self.chunk_tokens, identity.fingerprint
        )
        with self._lock:
            stored = self._index.stored_spans(spans)
        return [span for span in spans if span not in stored]

    def _evict(
        self, incoming: IncomingStore | None, token_ids: Sequence[int] = (), block_hashes: Sequence[int] = ()
    ) -> EvictionPlan:
        """Plan eviction for `incoming` (None: just fit the budget) and delete the victims."""
        now = self._clock()
        identity = self.identity

        def key_at(end: int) -> str:
            return prefix_key(end, token_ids, block_hashes, identity.block_size, identity.fingerprint)

        entries = eviction_entries(
            self._index.all(), now, self._loaded_at, self.protect_loaded_s, len(token_ids), key_at
        )
        others = other_models_bytes(self.root, self.directory)
        budget = max(0, self.budget_bytes - others)
        plan = plan_eviction(entries, self._index.chunk_bytes(), budget, now, incoming, self.policy)
        if others and not plan.can_store and not self._is_crowded:
            logger.warning(
                "kvstore: other models' checkpoints take %.1f of the %.1f MiB budget of %s; this "
                "model's checkpoints are skipped while they do (see `kvserve kv ls`, `kvserve kv prune`)",
                others / 2**20,
                self.budget_bytes / 2**20,
                self.root,
            )
        self._is_crowded = others > 0 and not plan.can_store
        for victim in plan.victim_ids:
            # Before the delete, so that a crash inside it never hides that it was meant.
            logger.info(
                "kvstore: evicting checkpoint %s (over the %d MiB budget)", victim, self.budget_bytes >> 20
            )
            self._delete(victim)
        self._num_evictions += len(plan.victim_ids)
        return plan

    def evict_to_budget(self) -> list[str]:
        """Delete lowest-scoring checkpoints until the store fits its budget (e.g. after a cut).
        Waits for a save in flight: its plan counted on the chunks it reuses staying."""
        with self._save_lock, self._lock:
            return list(self._evict(None).victim_ids)

    def lookup_by_text_prefix(self, text: str, max_tokens: int | None = None) -> Checkpoint | None:
        """The checkpoint with the longest rendered text that is a prefix of `text`."""
        data = text.encode()
        with self._lock:
            candidates = self._index.text_candidates(len(data), max_tokens)
            best = longest_text_prefix(data, candidates)
            return None if best is None else self._index.get(best.sha1)

    def lookup_by_block_hashes(self, block_hashes: Sequence[int]) -> ChunkRun | None:
        """The longest run of stored chunks prefixing a request with these chain hashes."""
        with self._lock:
            block_size = self.identity.block_size
            run = longest_stored_run(block_hashes, block_size, self.chunk_tokens, self._index.stored_spans)
            if not run:
                return None
            return ChunkRun(tuple(run), tuple(self._index.users_of(run[-1].key)))

    def scored_checkpoints(self) -> list[tuple[Checkpoint, ScoredEntry]]:
        """Every checkpoint with its marginal bytes and eviction score now (the lowest goes first)."""
        with self._lock:
            checkpoints = self._index.all()
            chunk_sizes = self._index.chunk_bytes()
        now = self._clock()
        entries = eviction_entries(checkpoints, now, self._loaded_at, self.protect_loaded_s)
        return list(zip(checkpoints, score_entries(entries, chunk_sizes, now, self.policy), strict=True))

    def get(self, checkpoint_id: str) -> Checkpoint | None:
        with self._lock:
            return self._index.get(checkpoint_id)

    def checkpoints(self) -> list[Checkpoint]:
        with self._lock:
            return self._index.all()

    def token_ids(self, checkpoint: Checkpoint | str) -> list[int] | None:
        """A checkpoint's exact tokens (from its manifest, no KV read): after a text-prefix hit
        the prompt becomes these + tokenize(rest of the text), whose block hashes then find
        the checkpoint's chunks."""
        checkpoint_id = checkpoint if isinstance(checkpoint, str) else checkpoint.checkpoint_id
        with self._lock:
            manifest = self._files.read_manifest(checkpoint_id)
            return None if manifest is None else manifest.token_ids

    def export(self, checkpoint_id: str) -> ExportedCheckpoint | None:
        """A checkpoint's manifest (bytes and decoded) and the paths of its chunk files, for the
        shared tier to publish; None if it is gone or its manifest is bad. The chunk files are read
        by the caller, outside the lock: they are immutable, and a missing one (evicted meanwhile)
        is the caller's FileNotFoundError."""
        with self._lock:
            manifest = self._files.read_manifest(checkpoint_id)
            if manifest is None:
                return None
            data = encode_manifest(manifest.meta, manifest.token_ids, manifest.chunks)
            paths = {span.key: self._files.chunks.path(span.key) for span in manifest.chunks}
            return ExportedCheckpoint(manifest, data, paths)

    def load(self, checkpoint: Checkpoint | str) -> LoadedKV | None:
        """Read and verify a checkpoint's tokens and KV; None if it is gone or was corrupt
        (a corrupt entry is deleted). Counts a hit and protects it from eviction for a while."""
        checkpoint_id = checkpoint if isinstance(checkpoint, str) else checkpoint.checkpoint_id
        with self._lock:
            read = self._files.read_checkpoint(checkpoint_id)
            if read is None:
                return None
            manifest, loaded = read
            self._num_loads += 1
            self._record_use(manifest.meta, manifest.token_ids, hit=True)
            return loaded

    def load_run(self, run: ChunkRun) -> LoadedKV | None:
        """Read and verify the chunks of a block-hash hit; None if any was missing or corrupt."""
        with self._lock:
            loaded = self._files.read_run(run.chunks)
            if loaded is not None:
                self._num_loads += 1
                for checkpoint_id in run.checkpoint_ids:
                    self.hit(checkpoint_id)
            return loaded

    def verify(self) -> int:
        """Fully verify every checkpoint (payload hashes included), removing bad ones; returns
        how many were removed. Reads everything: for `kvserve kv verify`, not for serving."""
        with self._lock:
            before = self._files.num_corrupt_removed
            for checkpoint_id in sorted(self._index.checkpoint_ids()):
                self._files.read_checkpoint(checkpoint_id)
            return self._files.num_corrupt_removed - before

    def hit(self, checkpoint_id: str) -> bool:
        return self.touch(checkpoint_id, hit=True)

    def touch(self, checkpoint_id: str, *, hit: bool = False) -> bool:
        """Mark a checkpoint used now (counting a hit if `hit`); False if it is gone."""
        with self._lock:
            manifest = self._files.read_manifest(checkpoint_id)
            if manifest is not None:
                self._record_use(manifest.meta, manifest.token_ids, hit=hit)
            return manifest is not None

    def _record_use(self, meta: CheckpointMeta, token_ids: Sequence[int], *, hit: bool) -> None:
        now = self._clock()
        if hit:
            self._loaded_at[meta.checkpoint_id] = now
        self._files.rewrite_manifest(meta.used(now, hit=hit), token_ids)

    def delete(self, checkpoint_id: str) -> bool:
        if not is_checkpoint_id(checkpoint_id):  # no such checkpoint, and never a path
            return False
        with self._lock:
            return self._delete(checkpoint_id)

    def _delete(self, checkpoint_id: str) -> bool:
        self._loaded_at.pop(checkpoint_id, None)
        return self._files.delete(checkpoint_id)

    def stats(self) -> StoreStats:
        with self._lock:
            index = self._index
            sizes = (len(index.checkpoint_ids()), len(index.chunk_bytes()), index.total_bytes())
            files = self._files
            return StoreStats(
                *sizes,
                self._num_loads,
                self._num_evictions,
                files.num_corrupt_removed,
                files.disk_errors.num_failures,
            )


def _migrate_if_idle(root: Path) -> None:
    """Move an old flat-layout cache into per-model subdirectories, when no other process
    uses the directory (else it stays until a later start; the server ignores it meanwhile)."""
    if not has_flat_layout(root):
        return
    try:
        lock = DirLock(root, exclusive=True)
    except CacheDirBusyError:
        logger.info("kvstore: %s is in use; its old flat-layout checkpoints stay until a later start", root)
        return
    except OSError as error:  # read-only: nothing can be moved
        logger.warning("kvstore: cannot migrate the old flat layout of %s: %s", root, error)
        return
    try:
        migrate_flat_layout(root)
    except OSError as error:
        logger.warning("kvstore: migrating the old flat layout of %s failed: %s", root, error)
    finally:
        lock.release()
