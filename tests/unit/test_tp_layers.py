"""Tensor-parallel layers in one process: each rank's slice is computed alone and the collective
is played by summing (all-reduce) or concatenating (all-gather) the ranks' results."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvserve.distributed.group import TPGroup
from kvserve.distributed.layers import ColumnParallelMergedLinear, RowParallelLinear, VocabParallelEmbedding
from kvserve.distributed.partition import Span, split_evenly
from kvserve.models.config import arch_config_from_hf
from kvserve.models.loader.safetensors import load_state_dict_into
from kvserve.models.registry import build_model
from tests.models.helpers import make_tiny_hf_model


@dataclass(frozen=True)
class LocalGroup(TPGroup):
    """A rank of a group that does not exist: collectives return this rank's part."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_vocab_parallel_embedding_ranks_sum_to_the_full_lookup_exactly() -> None:
    weight, ids = torch.randn(10, 4), torch.tensor([0, 3, 4, 9, 8, 7, 3])
    total = torch.zeros(len(ids), 4)
    for rank in range(3):  # parts of 4, 4, 2 rows; the last one zero-padded
        embedding = VocabParallelEmbedding(10, 4, None, LocalGroup(rank, 3))
        embedding.load_weight("weight", weight)
        total += embedding(ids)
    assert torch.equal(total, weight[ids])


def test_row_parallel_partial_sums_give_the_full_matmul_with_the_bias_once() -> None:
    weight, bias, x = torch.randn(5, 9), torch.randn(5), torch.randn(3, 9)
    total = torch.zeros(3, 5)
    for rank in range(2):
        span = split_evenly(9, 2, rank)
        linear = RowParallelLinear(span, 5, bias=True, group=LocalGroup(rank, 2))
        linear.load_weight("weight", weight)
        linear.load_weight("bias", bias)
        # Each rank adds the bias after its all-reduce; summing the ranks here counts it twice.
        total += linear(x[:, span.start : span.end]) - (bias if rank else 0)
    torch.testing.assert_close(total, x @ weight.T + bias)


def test_column_parallel_shards_take_their_rows_of_each_projection() -> None:
    q, k = torch.randn(6, 3), torch.randn(4, 3)
    linear = ColumnParallelMergedLinear(3, (Span(2, 3), Span(1, 2)), bias=False)
    linear.load_shard("weight", 0, q)
    linear.load_shard("weight", 1, k)
    assert torch.equal(linear.weight, torch.cat([q[2:5], k[1:3]]))


def test_every_rank_of_a_sharded_model_loads_completely_from_full_checkpoint_tensors() -> None:
    hf = make_tiny_hf_model("qwen3")
    arch = arch_config_from_hf(hf.config.to_dict())
    for rank in range(2):
        model = build_model(arch, torch.float32, "cpu", tp=LocalGroup(rank, 2))
        load_state_dict_into(model, hf.state_dict().items())  # raises on a missing or mis-shaped slice
        attn = model.model.layers[0].self_attn
        assert (attn.num_heads, attn.num_kv_heads) == (2, 1)
        assert model.kv_cache_spec() == (arch.num_hidden_layers, 1, arch.head_dim)
        full_q = hf.model.layers[0].self_attn.q_proj.weight
        assert torch.equal(
            attn.qkv_proj.weight[: 2 * arch.head_dim],
            full_q[rank * 2 * arch.head_dim : (rank + 1) * 2 * arch.head_dim],
        )
