"""KV head shards between the ranks' pools and the all-heads layout of the disk tier."""

from __future__ import annotations

import torch

from kvserve.distributed.kv_shards import assemble_heads, empty_shard, read_blocks, split_heads, write_blocks
from kvserve.distributed.partition import attention_shard

NUM_LAYERS, BLOCK_SIZE, HEAD_DIM = 3, 4, 5


def _spans(num_heads: int, num_kv_heads: int, world_size: int) -> list:
    return [attention_shard(num_heads, num_kv_heads, world_size, r).kv for r in range(world_size)]


def _pools(
    spans: list, full: list[torch.Tensor], block_ids: list[int], num_blocks: int
) -> list[list[torch.Tensor]]:
    """Each rank's pool holding its heads of `full` (per layer [2, tokens, heads, dim]) at block_ids."""
    pools = []
    for span in spans:
        caches = [torch.zeros(2, num_blocks, BLOCK_SIZE, span.size, HEAD_DIM) for _ in range(NUM_LAYERS)]
        for cache, layer in zip(caches, full, strict=True):
            blocks = layer[:, :, span.start : span.end].reshape(
                2, len(block_ids), BLOCK_SIZE, span.size, HEAD_DIM
            )
            cache[:, block_ids] = blocks
        pools.append(caches)
    return pools


def test_uneven_and_replicated_shards_reassemble_every_head_in_order() -> None:
    block_ids = [5, 1, 3]
    for num_heads, num_kv_heads, world_size in ((9, 3, 2), (8, 2, 4), (8, 4, 2)):
        spans = _spans(num_heads, num_kv_heads, world_size)
        max_heads = max(s.size for s in spans)
        full = [
            torch.randn(2, len(block_ids) * BLOCK_SIZE, num_kv_heads, HEAD_DIM) for _ in range(NUM_LAYERS)
        ]
        pools = _pools(spans, full, block_ids, num_blocks=8)
        shards = [read_blocks(pool, block_ids, max_heads) for pool in pools]
        assembled = assemble_heads(shards, spans, num_kv_heads)
        assert all(torch.equal(a, f) for a, f in zip(assembled, full, strict=True))


def test_split_heads_then_write_blocks_fills_each_rank_with_its_heads() -> None:
    spans = _spans(9, 3, 2)
    block_ids = [2, 6]
    full = [torch.randn(2, len(block_ids) * BLOCK_SIZE, 3, HEAD_DIM) for _ in range(NUM_LAYERS)]
    expected = _pools(spans, full, block_ids, num_blocks=8)
    shards = split_heads(full, spans, max_heads=2)
    for span, shard, want in zip(spans, shards, expected, strict=True):
        caches = [torch.zeros(2, 8, BLOCK_SIZE, span.size, HEAD_DIM) for _ in range(NUM_LAYERS)]
        assert empty_shard(caches, len(block_ids), 2).shape == shard.shape
        write_blocks(caches, block_ids, shard)
        assert all(torch.equal(c, w) for c, w in zip(caches, want, strict=True))
