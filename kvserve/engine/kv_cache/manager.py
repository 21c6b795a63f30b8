"""KVCacheManager: each request's block table over one BlockPool, with automatic prefix sharing.

Every full block of a request whose KV has been computed (prompt and generated tokens
alike) is registered under its chain hash, so a later request that starts with the same
tokens (an exact repeat, a branch, or an extension of a finished conversation) reuses
those blocks instead of recomputing them, whether their owner is still running or gone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from kvserve.engine.kv_cache.block_hash import BlockHash, compute_block_hashes
from kvserve.engine.kv_cache.block_pool import Block, BlockPool, EvictCallback
from kvserve.engine.request import Request
from kvserve.engine.rope_regime import trained_key

if TYPE_CHECKING:
    from kvserve.engine.image_input import ImageInput


class CachedSequence(NamedTuple):
    """A released request's registered full blocks: tokens and their chain hashes (for the disk tier),
    and the images whose spans start among those tokens (they name a checkpoint beside its text)."""

    token_ids: list[int]
    block_hashes: list[BlockHash]
    images: tuple[ImageInput, ...] = ()


class ComputedBlocks(NamedTuple):
    blocks: list[Block]  # cached blocks covering the request's leading tokens
    num_computed_tokens: int  # len(blocks) * block_size


@dataclass
class PrefixCacheStats:
    """Counted once per admission (see allocate_slots), for metrics."""

    num_requests: int = 0
    num_query_tokens: int = 0
    num_hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_query_tokens if self.num_query_tokens else 0.0


FreeCallback = Callable[[Request, CachedSequence], None]


@dataclass(slots=True, eq=False)
class _RequestBlocks:
    """One request's state here, from its first hashing (an admission lookup) until it is freed."""

    block_hashes: list[BlockHash] = field(default_factory=list)  # of its full blocks, grown incrementally
    is_admitted: bool = False  # allocate_slots has given it a block table
    blocks: list[Block] = field(default_factory=list)
    # The same table as block ids, kept beside it: the scheduler hands every running request's ids
    # to the runner each step, and rebuilding a 40-block list for 256 requests per step is a large
    # share of the engine's host time per decode step.
    block_ids: list[int] = field(default_factory=list)
    num_cached_blocks: int = 0  # leading blocks already registered in the prefix cache


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, block_size: int, num_blocks: int, extra_key: bytes | str = b"") -> None:
        assert block_size > 0
        self.block_size = block_size
        self.extra_key = extra_key
        self.pool = BlockPool(num_blocks)
        self.stats = PrefixCacheStats()
        self._requests: dict[str, _RequestBlocks] = {}
        self._on_free: FreeCallback | None = None

    def listen(self, on_free: FreeCallback | None = None, on_evict: EvictCallback | None = None) -> None:
        """Register the notifications a KV tier below this cache needs (EngineCore's tier does, in
        its bind): `on_free` hears what a request leaves in the prefix cache when its blocks are
        freed (finished or preempted), `on_evict` each cached block about to be handed out again."""
        self._on_free = on_free
        self.pool.listen(on_evict)

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_usable_blocks(self) -> int:
        return self.pool.num_usable_blocks

    @property
    def max_num_tokens(self) -> int:
        """Most tokens one request's KV can ever occupy: the whole pool."""
        return self.pool.num_usable_blocks * self.block_size

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by requests (cached-but-free blocks count as free)."""
        return 1.0 - self.pool.num_free_blocks / self.pool.num_usable_blocks

    def block_ids(self, request_id: str) -> list[int]:
        """The request's block table as ids. The live list, not a copy: it only ever grows while
        the request holds its blocks (a freed request's list is dropped, never cleared), so a
        caller may keep it for a step; nobody may modify it."""
        record = self._requests.get(request_id)
        return [] if record is None else record.block_ids

    def get_computed_blocks(self, request: Request) -> ComputedBlocks:
        """Longest chain of cached full blocks that prefixes the request's tokens.

        The hit is capped at num_tokens - 1 (rounded down to a block) because the last
        token must be computed to produce logits to sample from.
        """
        hashes = self._block_hashes(request, request.num_tokens)
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        blocks: list[Block] = []
        for block_hash in hashes[:max_hit_blocks]:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            blocks.append(block)
        return ComputedBlocks(blocks, len(blocks) * self.block_size)

    def allocate_slots(
        self, request: Request, num_new_tokens: int, new_computed_blocks: Sequence[Block] = ()
    ) -> list[Block] | None:
        """Grow the request's block table to hold `num_new_tokens` more tokens.

        `new_computed_blocks` (from get_computed_blocks, only at admission) are shared, not
        allocated. Returns the newly allocated blocks, or None (and changes nothing) when
        the pool cannot supply them.
        """
        record = self._requests.get(request.request_id)
        blocks = () if record is None else record.blocks
        # The common case, a decode inside its last block: nothing to do.
        if (
            not new_computed_blocks
            and blocks
            and _cdiv(request.num_computed_tokens + num_new_tokens, self.block_size) <= len(blocks)
        ):
            return []
        assert not new_computed_blocks or (not blocks and request.num_computed_tokens == 0), (
            "prefix hits are shared only at admission"
        )
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        num_needed = _cdiv(num_computed + num_new_tokens, self.block_size)
        num_new_blocks = max(0, num_needed - len(blocks) - len(new_computed_blocks))
        # Sharing a cached block that is free takes it off the free list too.
        num_revived = sum(1 for block in new_computed_blocks if block.ref_cnt == 0)
        if num_new_blocks + num_revived > self.pool.num_free_blocks:
            return None
        if record is None:
            record = self._requests[request.request_id] = _RequestBlocks()
        if not record.is_admitted:
            record.is_admitted = True
            record.num_cached_blocks = len(new_computed_blocks)
            self._record_admission(request, len(new_computed_blocks))
        # NOTE: touch before allocate, or allocate could evict the very blocks being shared.
        self.pool.touch(new_computed_blocks)
        new_blocks = self.pool.allocate(num_new_blocks)
        record.blocks.extend(new_computed_blocks)
        record.blocks.extend(new_blocks)
        record.block_ids.extend(block.block_id for block in new_computed_blocks)
        record.block_ids.extend(block.block_id for block in new_blocks)
        return new_blocks

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register the request's full blocks within its first `num_computed_tokens` tokens."""
        num_full = num_computed_tokens // self.block_size
        record = self._requests.get(request.request_id)
        num_cached = 0 if record is None else record.num_cached_blocks
        if num_full <= num_cached:
            return
        assert record is not None
        hashes = self._block_hashes(request, num_full * self.block_size)
        for index in range(num_cached, num_full):
            self.pool.cache_full_block(record.blocks[index], hashes[index])
        record.num_cached_blocks = num_full

    def free(self, request: Request) -> None:
        """Release the request's blocks (they stay cached until evicted). Unknown ids: no-op."""
        record = self._requests.pop(request.request_id, None)
        if record is None:
            return
        num_cached = record.num_cached_blocks
        if self._on_free is not None and num_cached:
            tokens = request.all_token_ids[: num_cached * self.block_size]
            images = tuple(image for image in request.images if image.offset < len(tokens))
            sequence = CachedSequence(tokens, record.block_hashes[:num_cached], images)
            self._on_free(request, sequence)
        self.pool.free(record.blocks)

    def block_hashes(self, request: Request, num_tokens: int | None = None) -> list[BlockHash]:
        """Chain hashes of the full blocks within the request's first `num_tokens` tokens (default all)."""
        num_tokens = request.num_tokens if num_tokens is None else num_tokens
        return self._block_hashes(request, num_tokens)[: num_tokens // self.block_size]

    def extra_key_of(self, request: Request) -> bytes | str:
        """The extra key of the request's chain hashes: the engine's, plus the RoPE regime's where the
        request runs with the model's trained RoPE (engine/rope_regime.py), so that one regime's KV
        is never found for the other."""
        return trained_key(self.extra_key) if request.uses_trained_rope else self.extra_key

    def lookup(self, block_hash: BlockHash) -> Block | None:
        return self.pool.lookup(block_hash)

    def load_cached_blocks(
        self, block_hashes: Sequence[BlockHash], keep: Sequence[Block] = ()
    ) -> list[Block] | None:
        """Blocks registered as cached under `block_hashes`, for KV about to be filled from disk.

        They are left free but cached at the most-recently-used end of the free list, so the
        next get_computed_blocks finds them like any other prefix hit. `keep` (the cached blocks
        before them) are protected from being evicted to make room. None when the pool cannot
        spare the blocks. The caller fills their KV before the next forward.
        """
        if len(block_hashes) + sum(1 for b in keep if b.ref_cnt == 0) > self.pool.num_free_blocks:
            return None
        self.pool.touch(keep)
        blocks = self.pool.allocate(len(block_hashes))
        for block, block_hash in zip(blocks, block_hashes, strict=True):
            self.pool.cache_full_block(block, block_hash)
        self.pool.free([*keep, *blocks])
        return blocks

    def reset_prefix_cache(self) -> None:
        """Drop every cached hash (e.g. after a weight reload). Blocks of running requests
        already registered stay unshared for the rest of their life."""
        self.pool.reset_prefix_cache()

    def _block_hashes(self, request: Request, num_tokens: int) -> list[BlockHash]:
        """The request's chain hashes covering its first `num_tokens` tokens, hashed incrementally."""
        record = self._requests.get(request.request_id)
        hashes = [] if record is None else record.block_hashes
        if len(hashes) < num_tokens // self.block_size:
            tokens = request.all_token_ids[:num_tokens]
            key = self.extra_key_of(request)
            hashes = compute_block_hashes(tokens, self.block_size, key, hashes, request.images)
            if record is None:
                record = self._requests[request.request_id] = _RequestBlocks()
            record.block_hashes = hashes
        return hashes

    def _record_admission(self, request: Request, num_hit_blocks: int) -> None:
        # Counted when allocation succeeds, so a request retried while blocked counts once.
        self.stats.num_requests += 1
        self.stats.num_query_tokens += request.num_tokens
        self.stats.num_hit_tokens += num_hit_blocks * self.block_size
