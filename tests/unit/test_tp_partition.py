"""Tensor-parallel partitions: contiguous, complete, balanced, and GQA groups kept together."""

from __future__ import annotations

import itertools

import pytest

from kvserve.distributed.partition import Span, attention_shard, split_evenly, vocab_shard


@pytest.mark.parametrize(("total", "parts"), [(9, 2), (3, 2), (8, 4), (1536, 2), (7, 7), (10, 3)])
def test_split_evenly_tiles_the_range_with_sizes_within_one(total: int, parts: int) -> None:
    spans = [split_evenly(total, parts, i) for i in range(parts)]
    assert spans[0].start == 0 and spans[-1].end == total
    assert all(a.end == b.start for a, b in itertools.pairwise(spans))
    assert max(s.size for s in spans) - min(s.size for s in spans) <= 1
    assert [s.size for s in spans] == sorted((s.size for s in spans), reverse=True)  # rank 0 largest


def _check_groups(num_heads: int, num_kv_heads: int, world_size: int) -> list:
    group = num_heads // num_kv_heads
    shards = [attention_shard(num_heads, num_kv_heads, world_size, r) for r in range(world_size)]
    for shard in shards:  # every query head of a rank reads one of the rank's KV heads
        assert all(shard.kv.start <= q // group < shard.kv.end for q in range(shard.q.start, shard.q.end))
    assert sorted(q for s in shards for q in range(s.q.start, s.q.end)) == list(range(num_heads))
    return shards


def test_kv_heads_split_with_their_query_groups_even_when_uneven() -> None:
    # SmolLM2-135M at TP=2: 9 query heads over 3 KV heads.
    shards = _check_groups(9, 3, 2)
    assert [(s.q, s.kv) for s in shards] == [(Span(0, 6), Span(0, 2)), (Span(6, 3), Span(2, 1))]
    shards = _check_groups(32, 8, 4)  # Llama-3.1-8B at TP=4
    assert [s.kv for s in shards] == [Span(0, 2), Span(2, 2), Span(4, 2), Span(6, 2)]


def test_fewer_kv_heads_than_ranks_replicates_each_kv_head() -> None:
    shards = _check_groups(8, 2, 4)
    assert [s.kv for s in shards] == [Span(0, 1), Span(0, 1), Span(1, 1), Span(1, 1)]
    assert [s.q for s in shards] == [Span(0, 2), Span(2, 2), Span(4, 2), Span(6, 2)]


def test_unshardable_head_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="replicated"):
        attention_shard(9, 3, 4, 0)  # 4 ranks over 3 KV heads
    with pytest.raises(ValueError, match="group"):
        attention_shard(9, 2, 2, 0)


def test_vocab_shards_are_equal_parts_the_last_one_short() -> None:
    assert [vocab_shard(10, 3, r) for r in range(3)] == [Span(0, 4), Span(4, 4), Span(8, 2)]
    assert [vocab_shard(49152, 2, r) for r in range(2)] == [Span(0, 24576), Span(24576, 24576)]
