"""SharedTier: one replica's view of the shared KV tier, beside its local disk tier.

- Publish: a checkpoint the local tier stored is copied to the shared store on a background
  thread, chunks first (each `put_if_absent`: a chunk another replica wrote already is not
  written again), its manifest last, so a visible manifest means its chunks are there.
- Find: a request's block chain hashes are matched against the in-memory index of the shared
  manifests (`index.py`); when they miss, the index is refreshed from the listing first (at most
  every `miss_refresh_s`), so a checkpoint another replica wrote a moment ago is found. The rate
  limit is the one window: a checkpoint published less than `miss_refresh_s` after this replica's
  last listing can be missed until the next one (a burst of cold prompts lists once, not per request).
- Load: chunks are read and verified (header, key, payload hash: the local tier's own checks)
  before any byte reaches the engine. A corrupt object, or a manifest whose chunk is missing, is
  deleted from the shared store and forgotten: never loaded, and the next writer of that chunk
  can write it again (`put_if_absent` would otherwise keep the bad copy forever).

Servers delete nothing else: shared-store eviction is the sweeper's (`sweep.py`).
Thread-safe: the engine thread finds and loads, the server's render threads ask for text
prefixes, the publisher and refresher threads write and list.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvserve.kvstore.checkpoint import ChunkRun, ChunkSpan, LoadedKV, StoreIdentity
from kvserve.kvstore.chunk_format import CorruptChunkError, decode_chunk
from kvserve.kvstore.chunk_store import read_run
from kvserve.kvstore.chunking import longest_stored_run
from kvserve.kvstore.disk_errors import DiskErrorLog
from kvserve.kvstore.layout import model_dir_name
from kvserve.kvstore.manifest import (
    CorruptManifestError,
    IncompatibleManifestError,
    Manifest,
    decode_manifest,
)
from kvserve.kvstore.shared.index import ObjectStamp, RefreshSchedule, SharedEntry, SharedIndex, plan_refresh
from kvserve.kvstore.shared.keys import chunk_key, manifest_key, manifests_prefix
from kvserve.kvstore.shared.object_store import ObjectStore
from kvserve.kvstore.text_prefix import longest_text_prefix

if TYPE_CHECKING:
    import torch

    from kvserve.kvstore.checkpoint_store import CheckpointStore

logger = logging.getLogger(__name__)

_MAX_PENDING_PUBLISHES = 64
_OWN_STAMP_TIME = -1.0  # an entry this replica published: the next listing's stamp replaces it


@dataclass(frozen=True)
class SharedTierStats:
    num_checkpoints: int  # in the index
    num_refreshes: int
    num_published: int  # manifests this replica wrote
    num_chunks_written: int  # chunks this replica wrote (the others were there already)
    num_bytes_written: int
    num_loads: int
    num_bytes_read: int
    num_corrupt_removed: int
    num_errors: int


class SharedTier:
    def __init__(
        self,
        store: ObjectStore,
        identity: StoreIdentity,
        *,
        chunk_tokens: int = 256,
        refresh_s: float = 10.0,
        miss_refresh_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        background: bool = True,
    ) -> None:
        """Lists the store once (raises ObjectStoreError when it cannot); with `background`, starts
        the publisher and the periodic refresher threads."""
        self.store = store
        self.identity = identity
        self.chunk_tokens = chunk_tokens
        self.model = model_dir_name(identity)
        self.index = SharedIndex()
        self.errors = DiskErrorLog(store.url)
        self._clock = clock
        self._schedule = RefreshSchedule(refresh_s, miss_refresh_s)
        self._skipped: dict[str, ObjectStamp] = {}  # unusable manifests, not read again while unchanged
        self._lock = threading.RLock()  # the index and counters
        self._refresh_lock = threading.Lock()  # one listing at a time
        self._num_refreshes = self._num_published = self._num_chunks_written = 0
        self._num_bytes_written = self._num_loads = self._num_bytes_read = self._num_corrupt = 0
        self.refresh()
        self._pending: queue.Queue[tuple[CheckpointStore, str] | None] = queue.Queue(_MAX_PENDING_PUBLISHES)
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        if background:
            for target, name in (
                (self._publish_loop, "kv-shared-publish"),
                (self._refresh_loop, "kv-shared-refresh"),
            ):
                thread = threading.Thread(target=target, name=name, daemon=True)
                thread.start()
                self._threads.append(thread)

    # -- refresh ----------------------------------------------------------------------

    def refresh(self) -> int:
        """List the manifests and bring the index in step; returns how many were new. Raises
        ObjectStoreError when the store cannot be listed."""
        with self._refresh_lock:
            listing = list(self.store.list(manifests_prefix(self.model)))
            with self._lock:
                plan = plan_refresh(self.model, listing, self.index.stamps(), self._skipped)
            entries = [e for cid, stamp in plan.fetch if (e := self._read_entry(cid, stamp)) is not None]
            with self._lock:
                for checkpoint_id in plan.drop:
                    self.index.remove(checkpoint_id)
                for entry in entries:
                    self.index.add(entry)
                self._num_refreshes += 1
            self._schedule.done(self._clock())
        if entries or plan.drop:
            logger.debug("shared KV tier: %d new checkpoints, %d gone", len(entries), len(plan.drop))
        return len(entries)

    def _read_entry(self, checkpoint_id: str, stamp: ObjectStamp) -> SharedEntry | None:
        manifest = self._read_manifest(checkpoint_id)
        if manifest is None:
            self._skipped[checkpoint_id] = stamp
            return None
        return SharedEntry.of(manifest, stamp)

    def _read_manifest(self, checkpoint_id: str) -> Manifest | None:
        """A verified manifest of this model; None when gone, unusable or corrupt (then deleted)."""
        key = manifest_key(self.model, checkpoint_id)
        data = self.store.get(key)
        if data is None:
            return None
        try:
            manifest = decode_manifest(data)
        except IncompatibleManifestError:  # another version's replica may still use it
            return None
        except CorruptManifestError as error:
            self._remove_corrupt([key], f"manifest {checkpoint_id}: {error}")
            return None
        meta = manifest.meta
        if meta.identity != self.identity or meta.checkpoint_id != checkpoint_id:
            self._remove_corrupt([key], f"manifest {checkpoint_id} names another model or checkpoint")
            return None
        return manifest

    def _maybe_refresh(self, *, miss: bool) -> None:
        if not self._schedule.due(self._clock(), miss=miss):
            return
        try:
            self.refresh()
        except OSError as error:
            self._schedule.done(self._clock())  # do not retry a dead store on every request
            self.errors.failed("listing the shared KV tier", error)

    def _refresh_loop(self) -> None:
        while not self._closed.wait(self._schedule.interval_s / 2):
            self._maybe_refresh(miss=False)

    # -- find and load ----------------------------------------------------------------

    def lookup_by_block_hashes(self, block_hashes: Sequence[int], *, want_tokens: int = 0) -> ChunkRun | None:
        """The longest run of shared chunks prefixing a request with these chain hashes. When it
        covers fewer than `want_tokens` tokens, the index is refreshed first (rate limited)."""
        run = self._find(block_hashes)
        if want_tokens and (run is None or run.num_tokens < want_tokens):
            self._maybe_refresh(miss=True)
            run = self._find(block_hashes)
        return run

    def _find(self, block_hashes: Sequence[int]) -> ChunkRun | None:
        with self._lock:
            block_size = self.identity.block_size
            run = longest_stored_run(block_hashes, block_size, self.chunk_tokens, self.index.stored_spans)
            if not run:
                return None
            return ChunkRun(tuple(run), tuple(self.index.users_of(run[-1].key)))

    def load_run(self, run: ChunkRun) -> LoadedKV | None:
        """Read and verify the run's chunks; None if one is missing or corrupt (it and the manifests
        using it are removed from the store) or the store cannot be read."""
        try:
            loaded = read_run(run.chunks, self.identity, self._read_chunk)
        except CorruptChunkError as error:
            self._remove_chunk(error.key, str(error))
            return None
        except OSError as error:
            self.errors.failed("reading the shared KV tier", error)
            return None
        with self._lock:
            self._num_loads += 1
        return loaded

    def _read_chunk(self, span: ChunkSpan) -> tuple[list[int], list[torch.Tensor]]:
        data = self.store.get(chunk_key(self.model, span.key))
        if data is None:
            raise CorruptChunkError(f"chunk {span.key} is missing")
        with self._lock:
            self._num_bytes_read += len(data)
        return decode_chunk(bytearray(data), self.identity, span)

    def _remove_chunk(self, key: str, why: str) -> None:
        with self._lock:
            users = self.index.users_of(key)
        self._remove_corrupt(
            [chunk_key(self.model, key), *(manifest_key(self.model, u) for u in users)], why, users
        )

    def _remove_corrupt(self, keys: Sequence[str], why: str, checkpoint_ids: Sequence[str] = ()) -> None:
        logger.warning("shared KV tier: removing %s: %s", ", ".join(keys), why)
        with self._lock:
            self._num_corrupt += 1
            for checkpoint_id in checkpoint_ids:
                self.index.remove(checkpoint_id)
        try:
            for key in keys:
                self.store.delete(key)
        except OSError as error:
            self.errors.failed("removing a corrupt shared object", error)

    def token_ids(self, checkpoint_id: str) -> list[int] | None:
        try:
            manifest = self._read_manifest(checkpoint_id)
        except OSError as error:
            self.errors.failed("reading the shared KV tier", error)
            return None
        if manifest is None:
            with self._lock:
                self.index.remove(checkpoint_id)
        return None if manifest is None else manifest.token_ids

    def text_prefix(self, text: str) -> tuple[list[int], int] | None:
        """The exact tokens of the shared checkpoint whose text is the longest prefix of `text`,
        with that prefix's length in UTF-8 bytes."""
        data = text.encode()
        # Asked while a prompt is rendered (off the engine thread), before any block-hash lookup
        # could refresh the index: a turn another replica just finished must be found here, or the
        # prompt is re-tokenized and may leave its checkpoint where the tokens differ.
        self._maybe_refresh(miss=True)
        with self._lock:
            best = longest_text_prefix(data, self.index.text_candidates(len(data)))
        token_ids = None if best is None else self.token_ids(best.sha1)
        return None if best is None or token_ids is None else (token_ids, best.num_bytes)

    # -- publish ----------------------------------------------------------------------

    def publish(self, local: CheckpointStore, checkpoint_id: str) -> bool:
        """Queue a local checkpoint for the shared store (no-op when it is known there already);
        False if the queue was full (it is published by a later save that contains it)."""
        with self._lock:
            if checkpoint_id in self.index or self._closed.is_set():
                return False
        try:
            self._pending.put_nowait((local, checkpoint_id))
        except queue.Full:
            logger.debug("shared KV tier: publish queue full, %s not published", checkpoint_id)
            return False
        return True

    def publish_now(self, local: CheckpointStore, checkpoint_id: str) -> bool:
        """Copy one local checkpoint to the shared store; True if its manifest is there now."""
        exported = local.export(checkpoint_id)
        if exported is None:
            return False
        manifest, manifest_bytes, paths = exported
        chunks_written = bytes_written = 0
        try:
            for span in manifest.chunks:
                data = paths[span.key].read_bytes()
                if self.store.put_if_absent(chunk_key(self.model, span.key), data):
                    chunks_written += 1
                    bytes_written += len(data)
            wrote = self.store.put_if_absent(manifest_key(self.model, checkpoint_id), manifest_bytes)
        except FileNotFoundError:  # evicted locally meanwhile: a later save publishes the prefix
            logger.debug("shared KV tier: %s evicted locally before it was published", checkpoint_id)
            return False
        except OSError as error:
            self.errors.failed(f"publishing checkpoint {checkpoint_id}", error)
            return False
        self.errors.succeeded()
        with self._lock:
            self._num_chunks_written += chunks_written
            self._num_bytes_written += bytes_written + (len(manifest_bytes) if wrote else 0)
            self._num_published += int(wrote)
            if checkpoint_id not in self.index:
                self.index.add(SharedEntry.of(manifest, ObjectStamp(len(manifest_bytes), _OWN_STAMP_TIME)))
        logger.info(
            "shared KV tier: checkpoint %s (%d tokens) %s, %d of its %d chunks written",
            checkpoint_id[:12], manifest.meta.num_tokens, "published" if wrote else "was there already",
            chunks_written, len(manifest.chunks),
        )  # fmt: skip
        return True

    def _publish_loop(self) -> None:
        while (item := self._pending.get()) is not None:
            try:
                self.publish_now(*item)
            except Exception:  # the thread's edge: keep publishing the next ones
                logger.exception("shared KV tier: publishing %s failed", item[1])
            finally:
                self._pending.task_done()
        self._pending.task_done()

    def flush(self) -> None:
        """Wait until every queued checkpoint is published (or failed)."""
        self._pending.join()

    def close(self, timeout_s: float = 60.0) -> None:
        """Publish what is queued (up to `timeout_s`), then stop the threads. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._threads:
            deadline = time.monotonic() + timeout_s
            try:
                self._pending.put(None, timeout=timeout_s)
            except queue.Full:
                logger.warning("shared KV tier: publishing did not finish in %.0f s; stopping", timeout_s)
                return
            for thread in self._threads:
                thread.join(max(0.0, deadline - time.monotonic()))

    def stats(self) -> SharedTierStats:
        with self._lock:
            return SharedTierStats(
                len(self.index),
                self._num_refreshes,
                self._num_published,
                self._num_chunks_written,
                self._num_bytes_written,
                self._num_loads,
                self._num_bytes_read,
                self._num_corrupt,
                self.errors.num_failures,
            )
