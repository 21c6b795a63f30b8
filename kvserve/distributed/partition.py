"""Which slice of each sharded dimension a rank owns (pure arithmetic, no torch).

Splits are contiguous and as even as possible, the larger parts first, so a model whose head
count does not divide by the rank count still shards (SmolLM2-135M: 9 heads, 3 KV heads at
TP=2 -> 2 KV groups on rank 0, 1 on rank 1). Row-parallel layers all-reduce full-size outputs,
so uneven inner dimensions cost nothing but balance.
"""

from __future__ import annotations

from typing import NamedTuple


class Span(NamedTuple):
    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size


def split_evenly(total: int, num_parts: int, index: int) -> Span:
    """Part `index` of `total` items cut into `num_parts` contiguous parts (sizes differ by <= 1)."""
    assert 0 <= index < num_parts and total >= num_parts, (total, num_parts, index)
    base, extra = divmod(total, num_parts)
    return Span(index * base + min(index, extra), base + (index < extra))


class HeadShard(NamedTuple):
    """One rank's attention heads: query heads and the KV heads they read, as head ranges."""

    q: Span
    kv: Span


def attention_shard(num_heads: int, num_kv_heads: int, world_size: int, rank: int) -> HeadShard:
    """KV heads are split across ranks with their query groups; with fewer KV heads than ranks
    each KV head is replicated on world_size / num_kv_heads ranks, which split its group."""
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads do not group over {num_kv_heads} KV heads")
    group = num_heads // num_kv_heads  # query heads per KV head
    if num_kv_heads >= world_size:
        kv = split_evenly(num_kv_heads, world_size, rank)
        return HeadShard(Span(kv.start * group, kv.size * group), kv)
    if world_size % num_kv_heads or num_heads % world_size:
        raise ValueError(
            f"tensor parallel size {world_size}: {num_kv_heads} KV heads can be replicated only over a "
            f"multiple of their count, with the {num_heads} query heads divisible by it"
        )
    q_per_rank = num_heads // world_size
    q = Span(rank * q_per_rank, q_per_rank)
    return HeadShard(q, Span(q.start // group, 1))


def vocab_shard(vocab_size: int, world_size: int, rank: int) -> Span:
    """Equal parts of ceil(vocab / world_size) rows (the last one padded past the vocab), so the
    gathered logits have a fixed width to trim; the returned size counts real rows only."""
    part = -(-vocab_size // world_size)
    start = min(rank * part, vocab_size)
    return Span(start, min(part, vocab_size - start))


def padded_vocab_part(vocab_size: int, world_size: int) -> int:
    return -(-vocab_size // world_size)
