"""Turn a freshly built (meta-device) family module into one rank's shard, in place.

Family files stay tensor-parallel-free: they build the full model from the shared blocks, and
this swaps each block's projections for their parallel versions with the rank's sizes, before
any memory is allocated (`registry.build_model` calls it inside its meta-device scope).
"""

from __future__ import annotations

from torch import nn

from kvserve.distributed.group import TPGroup
from kvserve.distributed.layers import (
    ColumnParallelMergedLinear,
    LogitsGather,
    RowParallelLinear,
    VocabParallelEmbedding,
    VocabParallelLMHead,
)
from kvserve.distributed.partition import Span, attention_shard, split_evenly
from kvserve.models.blocks import MLP, Attention
from kvserve.models.common import CausalLMBase
from kvserve.models.config import ModelArchConfig


def check_shardable(arch: ModelArchConfig, world_size: int) -> None:
    """Raise ValueError (with the reason) when `arch` cannot be split over `world_size` ranks."""
    if world_size < 1:
        raise ValueError("--tensor-parallel-size must be >= 1")
    attention_shard(arch.num_attention_heads, arch.num_key_value_heads, world_size, 0)
    if arch.intermediate_size < world_size or arch.vocab_size < world_size:
        raise ValueError(f"{arch.architecture} is too small to split over {world_size} ranks")


def shard_model(model: CausalLMBase, group: TPGroup) -> None:
    arch = model.arch
    check_shardable(arch, group.world_size)
    for module in list(model.modules()):
        if isinstance(module, Attention):
            _shard_attention(module, arch, group)
        elif isinstance(module, MLP):
            _shard_mlp(module, arch, group)
    embed = model.model.embed_tokens
    model.model.embed_tokens = VocabParallelEmbedding(arch.vocab_size, arch.hidden_size, embed.scale, group)
    if model.lm_head is not None:
        model.lm_head = VocabParallelLMHead(arch.hidden_size, arch.vocab_size, group)
    model.logits_gather = LogitsGather(arch.vocab_size, group)


def _rows(heads: Span, head_dim: int) -> Span:
    return Span(heads.start * head_dim, heads.size * head_dim)


def _shard_attention(attn: Attention, arch: ModelArchConfig, group: TPGroup) -> None:
    shard = attention_shard(arch.num_attention_heads, arch.num_key_value_heads, group.world_size, group.rank)
    q_rows, kv_rows = _rows(shard.q, attn.head_dim), _rows(shard.kv, attn.head_dim)
    qkv_bias = attn.qkv_proj.bias is not None
    attn.qkv_proj = ColumnParallelMergedLinear(arch.hidden_size, (q_rows, kv_rows, kv_rows), bias=qkv_bias)
    attn.o_proj = _row_parallel(attn.o_proj, q_rows, group)
    attn.num_heads, attn.num_kv_heads = shard.q.size, shard.kv.size


def _shard_mlp(mlp: MLP, arch: ModelArchConfig, group: TPGroup) -> None:
    inter = split_evenly(arch.intermediate_size, group.world_size, group.rank)
    mlp.gate_up_proj = ColumnParallelMergedLinear(arch.hidden_size, (inter, inter), bias=False)
    mlp.down_proj = _row_parallel(mlp.down_proj, inter, group)


def _row_parallel(linear: nn.Linear, span: Span, group: TPGroup) -> RowParallelLinear:
    return RowParallelLinear(span, linear.out_features, linear.bias is not None, group)
