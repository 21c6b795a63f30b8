"""BlockPool: the fixed set of KV blocks, their reference counts and the prefix-cache index.

A block is either in use (ref_cnt > 0, owned by one or more requests) or free. A free
block may still hold a cached full block (it has a hash and stays findable through
`lookup`) until it is handed out again: that is the eviction. The free list is ordered
LRU: blocks are handed out from its head and freed onto its tail.

NOTE: block 0 is the null block. It is never allocated, freed or cached: the runner pads
block tables with 0 and may point padding tokens' slots at it, so nothing lives there.
A pool of `num_blocks` therefore has `num_blocks - 1` usable blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kvserve.engine.kv_cache.block_hash import BlockHash

NULL_BLOCK_ID = 0


class NoFreeBlocksError(RuntimeError):
    """allocate() was asked for more blocks than are free; callers check num_free_blocks first."""


@dataclass(eq=False)
class Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None  # set once the block is full and registered in the cache
    was_allocated: bool = False  # ever handed out: its KV memory has been written (touched)


EvictCallback = Callable[[Block, BlockHash], None]


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        assert num_blocks >= 2, "one null block plus at least one usable block"
        self.blocks = [Block(block_id) for block_id in range(num_blocks)]
        # An OrderedDict keyed by block id gives O(1) removal from the middle (touch) and both ends.
        self._free: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks[1:])
        self._cached: dict[BlockHash, Block] = {}
        self._on_evict: EvictCallback | None = None
        # Blocks ever handed out. On CPU the pool's pages are mapped lazily (runner/model_runner.py),
        # so this, not num_blocks, is what the pool adds to the process's RSS.
        self.num_touched_blocks = 0

    def listen(self, on_evict: EvictCallback | None) -> None:
        """Be told (block, hash) just before a cached block is handed out again, while its KV still
        holds the cached tokens (nothing writes it before the next forward): a KV tier saves then."""
        self._on_evict = on_evict

    @property
    def num_usable_blocks(self) -> int:
        return len(self.blocks) - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks allocate() can hand out, cached-but-free ones included."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def lookup(self, block_hash: BlockHash) -> Block | None:
        return self._cached.get(block_hash)

    def allocate(self, num_blocks: int) -> list[Block]:
        """Take `num_blocks` from the head of the free list, evicting their cached contents."""
        if num_blocks > len(self._free):
            raise NoFreeBlocksError(f"asked for {num_blocks} blocks, {len(self._free)} free")
        allocated = []
        for _ in range(num_blocks):
            _, block = self._free.popitem(last=False)
            self._evict(block)
            block.ref_cnt = 1
            if not block.was_allocated:
                block.was_allocated = True
                self.num_touched_blocks += 1
            allocated.append(block)
        return allocated

    def free(self, blocks: Sequence[Block]) -> None:
        """Release one reference to each block of a sequence (given in sequence order).

        Blocks reaching 0 are queued in reverse, so a sequence's last blocks are evicted
        before its first ones: its prefix is the part most likely shared by a later request.
        Blocks without a hash hold nothing reusable and go to the head, to be handed out
        before any cached block is evicted.
        """
        for block in reversed(blocks):
            assert block.ref_cnt > 0 and block.block_id != NULL_BLOCK_ID, block
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = block
                if block.block_hash is None:
                    self._free.move_to_end(block.block_id, last=False)

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take one more reference to each (cached) block, pulling free ones off the free list."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def cache_full_block(self, block: Block, block_hash: BlockHash) -> None:
        """Register a full, computed block under its chain hash.

        If another block already holds the same hash (two requests computed the same
        prefix concurrently), the first one stays the cached copy and `block` stays
        uncached: it is released as a plain block.
        """
        assert block.ref_cnt > 0 and block.block_hash is None, block
        if block_hash not in self._cached:
            block.block_hash = block_hash
            self._cached[block_hash] = block

    def uncache(self, block: Block) -> None:
        """Forget one block's hash (its KV turned out not to hold what the hash says)."""
        if block.block_hash is not None and self._cached.get(block.block_hash) is block:
            del self._cached[block.block_hash]
        block.block_hash = None
        if block.ref_cnt == 0 and block.block_id in self._free:
            self._free.move_to_end(block.block_id, last=False)  # nothing reusable: hand it out first

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash. Blocks in use keep their data but are no longer shared."""
        for block in self._cached.values():
            block.block_hash = None
        self._cached.clear()

    def _evict(self, block: Block) -> None:
        if block.block_hash is not None:
            if self._on_evict is not None:
                self._on_evict(block, block.block_hash)
            del self._cached[block.block_hash]
            block.block_hash = None
