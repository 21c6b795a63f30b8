"""Block chain hashing and the BlockPool: null block, LRU free list, ref counts, prefix-cache index."""

from __future__ import annotations

import pytest

from kvserve.engine.kv_cache.block_hash import compute_block_hashes, hash_block_tokens
from kvserve.engine.kv_cache.block_pool import NULL_BLOCK_ID, BlockPool, NoFreeBlocksError

# --- hashing ---------------------------------------------------------------------------


def test_hash_is_deterministic_and_stable_across_processes() -> None:
    # A golden value: the disk tier keys chunks by these hashes, so they must never drift.
    assert hash_block_tokens(None, [1, 2, 3, 4], b"model") == 0x860EC899BD90F9D1529AA8318899B0E0
    assert hash_block_tokens(None, [1, 2, 3, 4], "model") == hash_block_tokens(None, (1, 2, 3, 4), b"model")


def test_hash_depends_on_parent_tokens_and_extra_key() -> None:
    base = hash_block_tokens(None, [1, 2, 3, 4], b"m")
    assert hash_block_tokens(None, [1, 2, 3, 5], b"m") != base
    assert hash_block_tokens(None, [1, 2, 3, 4], b"other-model") != base
    assert hash_block_tokens(base, [1, 2, 3, 4], b"m") != base
    assert hash_block_tokens(base, [1, 2, 3, 4], b"m") != hash_block_tokens(base + 1, [1, 2, 3, 4], b"m")


def test_block_hashes_chain_covers_only_full_blocks() -> None:
    tokens = list(range(10))
    hashes = compute_block_hashes(tokens, 4, b"m")
    assert len(hashes) == 2  # the 2 trailing tokens are not a full block
    assert hashes[0] == hash_block_tokens(None, tokens[0:4], b"m")
    assert hashes[1] == hash_block_tokens(hashes[0], tokens[4:8], b"m")


def test_block_hashes_extend_incrementally() -> None:
    tokens = list(range(100, 150))
    prefix_hashes = compute_block_hashes(tokens[:21], 4, b"m")
    assert compute_block_hashes(tokens, 4, b"m", start_hashes=prefix_hashes) == compute_block_hashes(
        tokens, 4, b"m"
    )


def test_equal_prefixes_share_hashes_until_they_diverge() -> None:
    a = list(range(32))
    b = a[:10] + [999] + a[11:]
    hashes_a, hashes_b = compute_block_hashes(a, 4), compute_block_hashes(b, 4)
    assert hashes_a[:2] == hashes_b[:2]
    assert all(x != y for x, y in zip(hashes_a[2:], hashes_b[2:], strict=True))


# --- pool ------------------------------------------------------------------------------


def test_null_block_is_reserved() -> None:
    pool = BlockPool(5)
    assert pool.num_usable_blocks == 4 and pool.num_free_blocks == 4
    blocks = pool.allocate(4)
    assert NULL_BLOCK_ID not in [b.block_id for b in blocks]
    assert all(b.ref_cnt == 1 for b in blocks)
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(1)
    pool.free(blocks)
    assert pool.num_free_blocks == 4


def test_allocate_takes_from_head_and_free_evicts_sequence_tail_first() -> None:
    pool = BlockPool(7)
    seq = pool.allocate(3)
    for index, block in enumerate(seq):
        pool.cache_full_block(block, 1000 + index)
    pool.free(seq)
    # The 3 never-used blocks come first, then the sequence from its last block backwards.
    order = [b.block_id for b in pool.allocate(6)]
    assert order[:3] == [4, 5, 6]
    assert order[3:] == [seq[2].block_id, seq[1].block_id, seq[0].block_id]


def test_lru_evicts_least_recently_freed_cached_block() -> None:
    pool = BlockPool(4)
    a, b, c = pool.allocate(3)
    for block, block_hash in ((a, 1), (b, 2), (c, 3)):
        pool.cache_full_block(block, block_hash)
    pool.free([b])
    pool.free([a])
    pool.free([c])
    (evicted,) = pool.allocate(1)
    assert evicted is b and b.block_hash is None
    assert pool.lookup(2) is None
    assert pool.lookup(1) is a and pool.lookup(3) is c


def test_uncached_free_blocks_are_reused_before_cached_ones_are_evicted() -> None:
    pool = BlockPool(4)
    cached, plain = pool.allocate(2)
    pool.cache_full_block(cached, 42)
    pool.free([cached])
    pool.free([plain])  # freed later, but holds nothing reusable
    assert pool.allocate(1) == [plain]
    assert pool.allocate(1)[0].block_id == 3
    assert pool.lookup(42) is cached


def test_touch_takes_cached_block_off_free_list_and_counts_refs() -> None:
    pool = BlockPool(3)
    a, b = pool.allocate(2)
    pool.cache_full_block(a, 7)
    pool.free([a, b])
    assert pool.num_free_blocks == 2
    hit = pool.lookup(7)
    assert hit is a
    pool.touch([hit])
    pool.touch([hit])
    assert a.ref_cnt == 2 and pool.num_free_blocks == 1
    assert pool.allocate(1) == [b]  # a is protected from eviction while referenced
    pool.free([a])
    assert a.ref_cnt == 1 and pool.num_free_blocks == 0
    pool.free([a])
    assert pool.num_free_blocks == 1 and pool.lookup(7) is a


def test_duplicate_hash_keeps_first_block_cached() -> None:
    pool = BlockPool(3)
    first, second = pool.allocate(2)
    pool.cache_full_block(first, 5)
    pool.cache_full_block(second, 5)
    assert pool.lookup(5) is first and second.block_hash is None
    pool.free([first, second])
    assert pool.allocate(1) == [second]  # the uncached duplicate goes first
    assert pool.lookup(5) is first


def test_reset_prefix_cache_forgets_hashes() -> None:
    pool = BlockPool(3)
    a, b = pool.allocate(2)
    pool.cache_full_block(a, 1)
    pool.cache_full_block(b, 2)
    pool.free([a])
    pool.reset_prefix_cache()
    assert pool.lookup(1) is None and pool.lookup(2) is None
    assert a.block_hash is None and b.block_hash is None and pool.num_cached_blocks == 0
    pool.free([b])
    assert pool.num_free_blocks == 2


def test_free_of_unreferenced_block_is_an_invariant_violation() -> None:
    pool = BlockPool(2)
    (block,) = pool.allocate(1)
    pool.free([block])
    with pytest.raises(AssertionError):
        pool.free([block])


def test_touched_blocks_count_each_block_once() -> None:
    # The pool's resident share on CPU: blocks handed out at least once, however often reused.
    pool = BlockPool(8)
    assert pool.num_touched_blocks == 0
    first = pool.allocate(3)
    pool.free(first)
    assert pool.num_touched_blocks == 3
    again = pool.allocate(3)  # freed uncached blocks go to the head: the same three come back
    assert {b.block_id for b in again} == {b.block_id for b in first}
    assert pool.num_touched_blocks == 3
    pool.allocate(4)
    assert pool.num_touched_blocks == 7 == pool.num_usable_blocks
