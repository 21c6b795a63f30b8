"""DiskTier: the disk KV tier (kvserve/kvstore) as the engine's KVTier (kv_tier.py).

- Lookup at admission: a waiting request whose prompt the RAM prefix cache misses in part
  is looked up on disk by its block chain hashes; the stored chunks that extend the RAM hit
  are read (the only time the engine waits on disk) into pool blocks registered as cached,
  so the scheduler's ordinary prefix lookup then finds them.
- Preload at start-up: the most recently used checkpoints into free pool blocks.
- Saves, copied out on the engine thread and written by the CheckpointWriter's thread:
  `cold` (first prefill without reuse, cut by the save policy), `continued` (absolute
  frontiers), `evict` (a released sequence whose blocks are being reused), `shutdown`, and
  the explicit saves a request's CheckpointHint asks for (kvserve's agent): `agent_system`
  (system prompt + tools, once prefilled) and `agent_session` (prompt + reply, at its finish).
- With a shared tier (kvstore/shared, `--kv-shared-dir` / `--kv-s3-url`): what the local store
  stores is published to it, a lookup that the local store misses is tried there (its chunks are
  read straight into pool blocks), and every finished turn is saved, so a session's next turn finds
  its prefix on whichever replica it lands.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, NamedTuple

import torch

from kvserve.config import KVStoreConfig
from kvserve.engine.disk_saves import RecentSequences, build_save_job, new_meta, resolve_block_ids
from kvserve.engine.kv_cache.block_hash import BlockHash, compute_block_hashes
from kvserve.engine.kv_cache.block_pool import Block
from kvserve.engine.kv_cache.manager import CachedSequence, KVCacheManager
from kvserve.engine.kv_tier import BlockCopier
from kvserve.engine.outputs import EngineOutput, SchedulerOutput
from kvserve.engine.request import Request
from kvserve.engine.rope_regime import trained_key
from kvserve.kvstore.checkpoint import ChunkRun, SaveReason, SaveResult, StoreIdentity
from kvserve.kvstore.checkpoint_store import CheckpointStore
from kvserve.kvstore.save_policy import SavePolicy, cold_cut, continued_frontier, system_cut
from kvserve.kvstore.shared.tier import SharedTier
from kvserve.kvstore.writer import CheckpointWriter

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DiskTierStats:
    num_hits: int  # requests that loaded KV from disk
    num_hit_tokens: int
    num_saves: int  # checkpoints written
    num_saved_bytes: int
    num_checkpoints: int
    num_bytes: int
    num_evictions: int
    num_shared_hits: int = 0  # requests that loaded KV from the shared tier
    num_shared_hit_tokens: int = 0


class _DiskHit(NamedTuple):
    """What lookup() found for a request, for the load() that follows it."""

    ram_blocks: list[Block]  # the RAM prefix hit the loaded blocks extend
    block_hashes: list[BlockHash]  # its full blocks before its last token (always computed)
    run: ChunkRun  # the stored chunks covering the prefix, past the RAM hit
    source: Literal["disk", "shared"] = "disk"  # the local store or the shared tier


@dataclass(slots=True)
class _DiskRequest:
    """The tier's state of one request, from its lookup or first step until it finishes."""

    is_looked_up: bool = False
    hit: _DiskHit | None = None  # between lookup() and load()
    is_prefilled: bool = False  # its cold-save decision is made
    last_frontier: int = 0  # tokens its latest cold/continued save (or disk load) covers
    num_written_tokens: int = 0  # tokens of KV its cold/continued/agent saves sent to disk


class DiskTier:
    can_load = True

    def __init__(
        self,
        config: KVStoreConfig,
        identity: StoreIdentity,
        text_of: Callable[[Sequence[int]], str],
        shared: SharedTier | None = None,
    ) -> None:
        """Opens (and repairs) the cache directory; raises OSError if it is unusable. The engine
        binds it to its KV cache (bind) before the first step. `shared`: the replicas' shared tier."""
        self.config = config
        self.shared = shared
        self.save_turns = shared is not None and config.shared is not None and config.shared.save_turns
        self.store = CheckpointStore(
            Path(config.directory).expanduser(),
            identity,
            config.budget_mb * 2**20,
            chunk_tokens=config.chunk_tokens,
        )
        self.writer = CheckpointWriter(
            self.store,
            config.max_pending_saves,
            on_result=self._on_saved,
            max_pending_bytes=config.max_pending_save_mb * 2**20,
        )
        self.policy = SavePolicy(
            min_tokens=config.min_tokens,
            align_tokens=config.align_tokens,
            continued_interval_tokens=config.continued_interval_tokens,
        )
        self.kv: KVCacheManager  # set by bind()
        self.runner: BlockCopier
        self.text_of = text_of
        self.block_size = identity.block_size
        # Turn-start token sequences of the chat template, for the `cold` cut (set by the server).
        self.turn_markers: tuple[Sequence[int], Sequence[int]] = ((), ())
        # Told (request id, RAM hit tokens, disk hit tokens, checkpoint id) at each admission lookup, on
        # the engine thread (set by the server: the web console shows where each prompt came from).
        self.on_source: Callable[[str, int, int, str | None], None] | None = None
        self.recent = RecentSequences()
        self._evicted: dict[BlockHash, int] = {}  # evicted this step: hash -> block (KV still intact)
        self._requests: dict[str, _DiskRequest] = {}
        # agent session id -> (its latest agent_session checkpoint, that checkpoint's last block hash)
        self._sessions: dict[str, tuple[str, int, BlockHash]] = {}
        self._num_hits = self._num_hit_tokens = self._num_saves = self._num_saved_bytes = 0
        self._num_shared_hits = self._num_shared_hit_tokens = 0
        self._closed = False
        self._final_stats: DiskTierStats | None = None
        stats = self.store.stats()
        logger.info(
            "disk KV cache %s: %d checkpoints, %.1f MiB (budget %d MiB)",
            config.directory,
            stats.num_checkpoints,
            stats.total_bytes / 2**20,
            config.budget_mb,
        )

    def bind(self, kv: KVCacheManager, blocks: BlockCopier) -> None:
        """Attach to the engine's KV cache (its free and evict notifications feed the `evict` and
        `shutdown` saves) and runner; then preload, if the config asks for it."""
        self.kv = kv
        self.runner = blocks
        kv.listen(on_free=self._on_free, on_evict=self._on_evict)
        if self.config.preload_fraction > 0:
            self.preload(self.config.preload_fraction)

    # -- lookup and load --------------------------------------------------------------

    def lookup(self, request: Request) -> int:
        """Prompt tokens past the RAM hit that stored chunks hold (asked once per request)."""
        record = self._record(request.request_id)
        if record.is_looked_up:
            return 0
        record.is_looked_up = True
        try:
            record.hit = self._lookup(request)
        except (OSError, sqlite3.Error) as error:  # the index is unreadable: prefill instead
            logger.warning("disk KV cache: lookup failed: %s", error)
            return 0
        hit = record.hit
        return 0 if hit is None else hit.run.num_tokens - len(hit.ram_blocks) * self.block_size

    def _lookup(self, request: Request) -> _DiskHit | None:
        ram = self.kv.get_computed_blocks(request)
        max_blocks = (request.num_tokens - 1) // self.block_size
        hashes = self.kv.block_hashes(request)[:max_blocks]
        run = self.store.lookup_by_block_hashes(hashes) if len(ram.blocks) < max_blocks else None
        n_ram = ram.num_computed_tokens
        shared_run = self._lookup_shared(hashes, max(n_ram, run.num_tokens if run else 0))
        if shared_run is not None:
            return _DiskHit(ram.blocks, hashes, shared_run, "shared")
        if run is None or run.num_tokens <= n_ram:
            self._log_source(request, n_ram, 0, run)
            return None
        return _DiskHit(ram.blocks, hashes, run)

    def _lookup_shared(self, hashes: list[BlockHash], num_found: int) -> ChunkRun | None:
        """The shared tier's run when it goes past the `num_found` tokens RAM and the local store
        hold. It refreshes its index first when it does not cover the whole prompt, unless what is
        missing is shorter than a checkpoint could be (not worth a listing)."""
        max_tokens = len(hashes) * self.block_size
        if self.shared is None or num_found >= max_tokens:
            return None
        want = max_tokens if max_tokens - num_found >= self.policy.min_tokens else 0
        run = self.shared.lookup_by_block_hashes(hashes, want_tokens=want)
        return run if run is not None and run.num_tokens > num_found else None

    def load(self, request: Request) -> int:
        """Read the chunks lookup() found into pool blocks registered as cached; returns the tokens
        loaded (0: no free blocks, or unreadable or mismatching chunks: the request prefills)."""
        record = self._requests.get(request.request_id)
        hit = None if record is None else record.hit
        if record is None or hit is None:
            return 0
        record.hit = None
        try:
            return self._load(request, hit, record)
        except (OSError, sqlite3.Error) as error:  # unreadable: prefill instead
            logger.warning("disk KV cache: load failed: %s", error)
            return 0

    def _load(self, request: Request, hit: _DiskHit, record: _DiskRequest) -> int:
        ram_blocks, hashes, run, _source = hit
        n_ram = len(ram_blocks) * self.block_size
        started = time.monotonic()
        spans = tuple(span for span in run.chunks if span.end > n_ram)
        blocks = self.kv.load_cached_blocks(
            hashes[n_ram // self.block_size : run.num_tokens // self.block_size], ram_blocks
        )
        self.save_evicted()  # blocks just reused for the load still hold what they cached
        if blocks is None:
            logger.info(
                "request %s: no free KV blocks to load %d tokens from disk",
                request.request_id,
                run.num_tokens,
            )
            return 0
        try:
            source = self.shared if hit.source == "shared" and self.shared is not None else self.store
            loaded = source.load_run(ChunkRun(spans, run.checkpoint_ids))
        except (OSError, sqlite3.Error) as error:  # unreadable: prefill instead
            logger.warning("disk KV cache: load failed: %s", error)
            loaded = None
        offset = n_ram - spans[0].start
        if loaded is None or list(loaded.token_ids[offset:]) != request.all_token_ids[n_ram : run.num_tokens]:
            self._forget(blocks)  # corrupt (already removed by the store) or a hash collision
            self._log_source(request, n_ram, 0, None)
            return 0
        self.runner.copy_blocks_in([b.block_id for b in blocks], [layer[:, offset:] for layer in loaded.kv])
        if hit.source == "shared":
            self._num_shared_hits += 1
            self._num_shared_hit_tokens += run.num_tokens - n_ram
        else:
            self._num_hits += 1
            self._num_hit_tokens += run.num_tokens - n_ram
        record.last_frontier = run.num_tokens
        elapsed = time.monotonic() - started
        self._log_source(request, n_ram, run.num_tokens - n_ram, run, elapsed, hit.source)
        return run.num_tokens - n_ram

    def preload(self, max_fraction: float) -> int:
        """At start-up: the most recently used checkpoints' KV into the RAM pool, as free cached
        blocks (evictable like any other), up to `max_fraction` of the pool's free blocks. A restart's
        first request then finds its prefix in RAM instead of waiting for the disk read. Returns the
        number of tokens loaded."""
        started = time.monotonic()
        budget = int(self.kv.pool.num_free_blocks * max_fraction)
        checkpoints = sorted(self.store.checkpoints(), key=lambda c: c.meta.last_used, reverse=True)
        loaded_tokens = loaded_checkpoints = 0
        for checkpoint in checkpoints:
            try:
                n = self._preload_one(checkpoint.checkpoint_id, budget)
            except (OSError, sqlite3.Error) as error:  # unreadable: the first request prefills instead
                logger.warning("disk KV cache: preload failed: %s", error)
                break
            if n is None:
                break  # the pool budget is spent
            budget -= n // self.block_size
            loaded_tokens += n
            loaded_checkpoints += n > 0
        if loaded_tokens:
            logger.info(
                "disk KV cache: preloaded %d tokens of %d checkpoint(s) into RAM (%.0f ms)",
                loaded_tokens,
                loaded_checkpoints,
                (time.monotonic() - started) * 1000,
            )
        return loaded_tokens

    def _preload_one(self, checkpoint_id: str, budget_blocks: int) -> int | None:
        """Tokens of this checkpoint newly loaded into RAM (0: nothing to add), None: over budget."""
        token_ids = self.store.token_ids(checkpoint_id)
        if token_ids is None:
            return 0
        # NOTE: a checkpoint keeps token ids, not images: where it holds an image, these text-only
        # hashes miss its chunks from the image's first block on, so only the prefix before it loads.
        # Nor its RoPE regime (engine/rope_regime.py): the engine's key is tried, then the trained one.
        found = self._preload_run(token_ids)
        if found is None:
            return 0
        hashes, run = found
        num_blocks = run.num_tokens // self.block_size
        ram: list[Block] = []  # a prefix already in RAM (shared with a checkpoint loaded before)
        while len(ram) < num_blocks and (block := self.kv.lookup(hashes[len(ram)])) is not None:
            ram.append(block)
        n_ram = len(ram) * self.block_size
        if len(ram) == num_blocks:
            return 0
        if num_blocks - len(ram) > budget_blocks:
            return None
        blocks = self.kv.load_cached_blocks(hashes[len(ram) : num_blocks], ram)
        if blocks is None:
            return None
        spans = tuple(span for span in run.chunks if span.end > n_ram)
        loaded = self.store.load_run(ChunkRun(spans, run.checkpoint_ids))
        offset = n_ram - spans[0].start
        if loaded is None or list(loaded.token_ids[offset:]) != token_ids[n_ram : run.num_tokens]:
            self._forget(blocks)
            return 0
        self.runner.copy_blocks_in([b.block_id for b in blocks], [layer[:, offset:] for layer in loaded.kv])
        return run.num_tokens - n_ram

    def _preload_run(self, token_ids: list[int]) -> tuple[list[BlockHash], ChunkRun] | None:
        """The chain hashes and stored run of a checkpoint's tokens, under the engine's key or else
        its trained-RoPE key (a checkpoint is stored under one of them)."""
        for key in (self.kv.extra_key, trained_key(self.kv.extra_key)):
            hashes = compute_block_hashes(token_ids, self.block_size, key)
            run = self.store.lookup_by_block_hashes(hashes)
            if run is not None:
                return hashes, run
        return None

    def _forget(self, blocks: list[Block]) -> None:
        """Unregister blocks whose KV could not be filled: nothing must find them."""
        for block in blocks:
            if block.block_hash is not None and self.kv.lookup(block.block_hash) is block:
                self.kv.pool.uncache(block)

    def _log_source(
        self,
        request: Request,
        n_ram: int,
        n_disk: int,
        run: ChunkRun | None,
        load_s: float = 0.0,
        source: str = "disk",
    ) -> None:
        n = request.num_prompt_tokens
        if self.on_source is not None:
            checkpoint_id = (
                run.checkpoint_ids[0] if n_disk and run is not None and run.checkpoint_ids else None
            )
            self.on_source(request.request_id, n_ram, n_disk, checkpoint_id)
        if n_disk:
            logger.info(
                "request %s: %d prompt tokens: %d from RAM, %d from %s checkpoint %s (%.0f ms), %d to prefill",
                request.request_id, n, n_ram, n_disk, "shared" if source == "shared" else "disk",
                run.checkpoint_ids[0][:12] if run and run.checkpoint_ids else "?",
                load_s * 1000, n - n_ram - n_disk,
            )  # fmt: skip
        elif n_ram:
            logger.info("request %s: %d prompt tokens: %d from live RAM cache", request.request_id, n, n_ram)
        else:
            logger.info("request %s: %d prompt tokens: cold (no cached prefix)", request.request_id, n)
        max_hit = (n - 1) // self.block_size * self.block_size
        if run is not None and n_ram + n_disk < max_hit:
            logger.info(
                "request %s: the prompt leaves the stored checkpoints (%s) after token %d",
                request.request_id,
                ", ".join(c[:12] for c in run.checkpoint_ids) or "?",
                run.num_tokens,
            )

    def text_prefix(self, text: str) -> tuple[list[int], int] | None:
        """The exact tokens of the stored checkpoint whose rendered text is the longest prefix of
        `text`, with that prefix's length in UTF-8 bytes. Thread-safe (the store locks): the
        server calls it while rendering, off the engine thread."""
        if self._closed:
            return None
        checkpoint = self.store.lookup_by_text_prefix(text)
        token_ids = None if checkpoint is None else self.store.token_ids(checkpoint)
        local = (
            None if checkpoint is None or token_ids is None else (token_ids, checkpoint.meta.text.num_bytes)
        )
        shared = None if self.shared is None else self.shared.text_prefix(text)
        if shared is not None and (local is None or shared[1] > local[1]):
            return shared
        return local

    # -- save triggers ----------------------------------------------------------------

    def save(self, scheduler_output: SchedulerOutput, outputs: list[EngineOutput]) -> list[EngineOutput]:
        """`cold`, `continued` and the agent's saves of this step's requests, then the outputs with
        how many tokens each request has sent to disk (for usage)."""
        records = self._requests
        for scheduled in scheduler_output.scheduled:
            request = scheduled.request
            record = records.get(request.request_id)
            if record is None:
                record = records[request.request_id] = _DiskRequest()
            hint = request.checkpoint_hint
            if not record.is_prefilled and request.num_computed_tokens >= request.num_prompt_tokens:
                record.is_prefilled = True
                if hint is not None and hint.save_system:
                    self._save_system(request)
                if request.num_cached_tokens == 0:
                    self._save_cold(request, record)
            if request.is_finished:
                if hint is not None and hint.save_session:  # (an aborted request is never scheduled)
                    self._save_session(request, hint.session_id)
                elif self.save_turns:
                    self._save_turn(request)
                continue
            frontier = continued_frontier(request.num_computed_tokens, record.last_frontier, self.policy)
            if frontier is not None:
                record.last_frontier = frontier
                self._save_request(request, frontier, "continued")
        return [
            replace(o, num_cache_write_tokens=state.num_written_tokens)
            if (state := records.get(o.request_id)) is not None and state.num_written_tokens
            else o
            for o in outputs
        ]

    def request_finished(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            self._requests.pop(request_id, None)

    def _record(self, request_id: str) -> _DiskRequest:
        record = self._requests.get(request_id)
        if record is None:
            record = self._requests[request_id] = _DiskRequest()
        return record

    def _save_cold(self, request: Request, record: _DiskRequest) -> None:
        user, assistant = self.turn_markers
        cut = cold_cut(request.prompt_token_ids, user, assistant, self.policy)
        if cut is None:
            return
        cut -= cut % self.block_size  # block aligned, so the token-hash lookup finds all of it
        if cut >= self.policy.min_tokens:
            record.last_frontier = max(cut, record.last_frontier)
            self._save_request(request, cut, "cold")

    def _save_system(self, request: Request) -> None:
        """`agent_system`: the system prompt + tools, which every session of the agent repeats.
        Stored once (the same text is the same checkpoint id), whatever the request hit."""
        cut = system_cut(request.prompt_token_ids, self.turn_markers[0])
        if cut is not None:
            self._save_request(request, cut, "agent_system")

    def _save_session(self, request: Request, session_id: str | None) -> None:
        """`agent_session`: prompt and reply, since the session's next prompt starts with both."""
        num_tokens = request.num_computed_tokens - request.num_computed_tokens % self.block_size
        logger.info(
            "request %s: agent_session checkpoint of session %s, %d tokens",
            request.request_id, session_id or "?", num_tokens,
        )  # fmt: skip
        self._save_request(request, num_tokens, "agent_session", session_id=session_id)

    def _save_turn(self, request: Request) -> None:
        """A finished turn (prompt + reply) for the shared tier: the session's next turn starts with
        it, and may be sent to another replica. An `agent_session` checkpoint without a session id
        (nothing is superseded by name; eviction takes the earlier turns first, as it does for the
        agent's); the chunks earlier turns stored are not written again."""
        num_tokens = request.num_computed_tokens - request.num_computed_tokens % self.block_size
        self._save_request(request, num_tokens, "agent_session")

    def _save_request(
        self,
        request: Request,
        num_tokens: int,
        reason: SaveReason,
        block: bool = False,
        session_id: str | None = None,
    ) -> None:
        num_tokens -= num_tokens % self.block_size
        if request.is_finished:  # freed already (its full blocks stay cached): hash afresh
            key = self.kv.extra_key_of(request)
            hashes = compute_block_hashes(
                request.all_token_ids[:num_tokens], self.block_size, key, images=request.images
            )
        else:
            hashes = self.kv.block_hashes(request, num_tokens)
        images = tuple(image for image in request.images if image.offset < num_tokens)
        sequence = CachedSequence(request.all_token_ids[:num_tokens], hashes, images)
        written = self._save(sequence, reason, block, session_id)
        if written:
            self._record(request.request_id).num_written_tokens += written

    def _save(
        self, sequence: CachedSequence, reason: SaveReason, block: bool = False, session_id: str | None = None
    ) -> int:
        """Submit a checkpoint; returns how many tokens of KV it sends to disk (0: none or skipped).
        With a `session_id`, the session's previous checkpoint (this process's) is deleted once this
        one is stored: a session resumes from its latest turn, never an older one."""
        token_ids, hashes, images = sequence
        if len(token_ids) < self.policy.min_tokens or self._closed:
            return 0
        try:
            meta = new_meta(self.store, self.text_of, token_ids, reason, images)
            if self.store.get(meta.checkpoint_id) is not None:
                if self.shared is not None:  # stored before the shared tier was (or could be) told
                    self.shared.publish(self.store, meta.checkpoint_id)
                return 0
            block_ids = resolve_block_ids(self.kv, hashes, self._evicted)
            if block_ids is None:
                return 0
            supersedes = self._superseded(session_id, hashes)
            job, num_new_tokens = build_save_job(
                self.store, meta, token_ids, hashes, block_ids, self._copy_out, supersedes
            )
        except (OSError, sqlite3.Error) as error:  # a checkpoint is an optimization: skip it, keep serving
            logger.warning("disk KV cache: %s checkpoint skipped: %s", reason, error)
            return 0
        if not self.writer.submit(job, block=block):
            return 0
        if session_id and hashes:
            self._sessions[session_id] = (meta.checkpoint_id, len(hashes), hashes[-1])
        return num_new_tokens

    def _copy_out(self, block_ids: list[int]) -> list[torch.Tensor]:
        """The blocks' KV, in the pool's dtype, which is the store's (EngineCore's StoreIdentity)."""
        return self.runner.copy_blocks_out(block_ids)

    def _superseded(self, session_id: str | None, hashes: Sequence[BlockHash]) -> str | None:
        """The session's previous checkpoint when this sequence extends it (chain hashes: the block
        at its end matches), else None: a compacted session, or another client that happens to use
        the same session name, never deletes a checkpoint it does not contain."""
        previous = self._sessions.get(session_id) if session_id else None
        if previous is None:
            return None
        checkpoint_id, num_blocks, last_hash = previous
        extends = num_blocks <= len(hashes) and hashes[num_blocks - 1] == last_hash
        return checkpoint_id if extends else None

    def _on_free(self, request: Request, sequence: CachedSequence) -> None:
        if len(sequence.token_ids) >= self.policy.min_tokens:
            self.recent.add(sequence)

    def _on_evict(self, block: Block, block_hash: BlockHash) -> None:
        self._evicted[block_hash] = block.block_id
        self.recent.block_evicted(block_hash)

    def save_evicted(self) -> None:
        """`evict` saves of the sequences that lost blocks since the last call. Must run after
        any allocation and before the next write into the pool (forward, disk load)."""
        for sequence in self.recent.take_evicting():
            self._save(sequence, "evict")
        self._evicted.clear()

    def _on_saved(self, result: SaveResult) -> None:  # writer thread: counters, and a queued publish
        if result.status == "stored":
            self._num_saves += 1
            self._num_saved_bytes += result.num_new_bytes
            if self.shared is not None:
                self.shared.publish(self.store, result.checkpoint_id)

    # -- shutdown and stats -----------------------------------------------------------

    def shutdown(self, running: Sequence[Request]) -> None:
        """Save what is live (running sequences, then released ones still cached), wait for the
        writer, close the store. Idempotent."""
        if self._closed:
            return
        for request in running:
            self._save_request(request, request.num_computed_tokens, "shutdown", block=True)
        for sequence in self.recent.newest_first():
            self._save(sequence, "shutdown", block=True)
        self.writer.close()
        if self.shared is not None:
            self.shared.close()  # publishes what the writer just stored
        self._final_stats = self.stats()
        self._closed = True
        self.store.close()
        logger.info("disk KV cache: %d checkpoints written this run", self._num_saves)

    def stats(self) -> DiskTierStats:
        if self._final_stats is not None:
            return self._final_stats
        store = self.store.stats()
        return DiskTierStats(
            self._num_hits,
            self._num_hit_tokens,
            self._num_saves,
            self._num_saved_bytes,
            store.num_checkpoints,
            store.total_bytes,
            store.num_evictions,
            self._num_shared_hits,
            self._num_shared_hit_tokens,
        )
