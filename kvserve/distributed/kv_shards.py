"""KV blocks between the ranks' pools (each holds its KV heads) and the disk tier (all heads).

A checkpoint on disk always holds every KV head in model order, so the store, its format and
its index stay single-writer on rank 0 and know nothing of tensor parallelism: a save gathers
the ranks' head shards to rank 0 and reassembles them; a load scatters each rank its heads.
Shards travel padded to the largest rank's head count (uneven splits), as one tensor per rank
of [num_layers, 2, num_tokens, max_heads, head_dim].
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from kvserve.distributed.group import TPGroup
from kvserve.distributed.partition import Span


def read_blocks(caches: Sequence[torch.Tensor], block_ids: list[int], max_heads: int) -> torch.Tensor:
    """This rank's KV of `block_ids`: [num_layers, 2, num_blocks * block_size, max_heads, head_dim]."""
    ids = torch.tensor(block_ids, dtype=torch.long, device=caches[0].device)
    kv = torch.stack([cache.index_select(1, ids).flatten(1, 2) for cache in caches])
    return F.pad(kv, (0, 0, 0, max_heads - kv.shape[-2]))


def empty_shard(caches: Sequence[torch.Tensor], num_blocks: int, max_heads: int) -> torch.Tensor:
    """A receive buffer shaped like read_blocks' result."""
    _, _, block_size, _, head_dim = caches[0].shape
    shape = (len(caches), 2, num_blocks * block_size, max_heads, head_dim)
    return caches[0].new_empty(shape)


def write_blocks(caches: Sequence[torch.Tensor], block_ids: list[int], shard: torch.Tensor) -> None:
    """Inverse of read_blocks: `shard` [num_layers, 2, tokens, >= local heads, head_dim] into the pool."""
    ids = torch.tensor(block_ids, dtype=torch.long, device=caches[0].device)
    for cache, layer in zip(caches, shard, strict=True):
        _, _, block_size, num_heads, head_dim = cache.shape
        blocks = layer[:, :, :num_heads].reshape(2, len(block_ids), block_size, num_heads, head_dim)
        cache.index_copy_(1, ids, blocks.to(cache.dtype))


def assemble_heads(
    shards: Sequence[torch.Tensor], spans: Sequence[Span], num_kv_heads: int
) -> list[torch.Tensor]:
    """Rank shards -> per layer [2, tokens, num_kv_heads, head_dim]; replicated heads are taken once."""
    num_layers, _, num_tokens, _, head_dim = shards[0].shape
    full = shards[0].new_empty(num_layers, 2, num_tokens, num_kv_heads, head_dim)
    for shard, span in zip(shards, spans, strict=True):
        full[:, :, :, span.start : span.end] = shard[:, :, :, : span.size]
    return list(full.unbind(0))


def split_heads(layers: Sequence[torch.Tensor], spans: Sequence[Span], max_heads: int) -> list[torch.Tensor]:
    """Per layer [2, tokens, num_kv_heads, head_dim] -> one padded shard per rank."""
    full = torch.stack(list(layers))  # [num_layers, 2, tokens, num_kv_heads, head_dim]
    return [F.pad(full[:, :, :, span.start : span.end], (0, 0, 0, max_heads - span.size)) for span in spans]


def gather_to_driver(group: TPGroup, shard: torch.Tensor) -> list[torch.Tensor] | None:
    """Every rank's shard on rank 0 (None elsewhere)."""
    out = [torch.empty_like(shard) for _ in range(group.world_size)] if group.is_driver else None
    dist.gather(shard, out, dst=0, group=group.device_group)
    return out


def scatter_from_driver(
    group: TPGroup, shards: list[torch.Tensor] | None, like: torch.Tensor
) -> torch.Tensor:
    """Rank r receives rank 0's shards[r] (into a tensor shaped like `like`)."""
    out = torch.empty_like(like)
    dist.scatter(out, shards, src=0, group=group.device_group)
    return out
