"""Tensor-parallel layers (after vLLM's ColumnParallelLinear / RowParallelLinear /
VocabParallelEmbedding, much smaller): each keeps only its rank's slice of a weight and takes the
full checkpoint tensor at load time (`load_weight` / `load_shard` narrow it), so a rank never
holds more than its shard plus one checkpoint tensor in flight.

- column-parallel (fused q/k/v, gate/up): rows of the output; no communication;
- row-parallel (o_proj, down_proj): columns of the input; partial sums all-reduced, bias once;
- vocab-parallel embedding and LM head: equal row ranges of the vocabulary (padded); the
  embedding all-reduces (exactly one rank contributes each row), the logits are all-gathered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.distributed.group import TPGroup
from kvserve.distributed.partition import Span, padded_vocab_part, vocab_shard
from kvserve.models.layers.embedding import Embedding
from kvserve.models.layers.linear import MergedLinear


@runtime_checkable
class LoadsFullWeights(Protocol):
    """A module that takes a full (unsharded) checkpoint tensor and keeps its rank's slice."""

    def load_weight(self, param_name: str, tensor: torch.Tensor) -> None: ...


def _copy_checked(target: torch.Tensor, tensor: torch.Tensor, what: str) -> None:
    if target.shape != tensor.shape:
        raise ValueError(f"{what}: expected {tuple(target.shape)}, got {tuple(tensor.shape)}")
    target.copy_(tensor)


class ColumnParallelMergedLinear(MergedLinear):
    """A MergedLinear whose shard i holds rows `spans[i]` of the checkpoint's projection i."""

    def __init__(self, in_features: int, spans: Sequence[Span], bias: bool) -> None:
        super().__init__(in_features, [span.size for span in spans], bias=bias)
        self.spans = tuple(spans)

    @torch.no_grad()
    def load_shard(self, param_name: str, shard: int, tensor: torch.Tensor) -> None:
        span = self.spans[shard]
        if tensor.shape[0] < span.end:
            raise ValueError(f"shard {shard} of {param_name}: {tensor.shape[0]} rows, need {span.end}")
        super().load_shard(param_name, shard, tensor.narrow(0, span.start, span.size))


class RowParallelLinear(nn.Linear):
    """Input columns `span` of a Linear; the outputs of all ranks are summed, then the bias added."""

    def __init__(self, span: Span, out_features: int, bias: bool, group: TPGroup) -> None:
        super().__init__(span.size, out_features, bias=bias)
        self.span, self.group = span, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.group.all_reduce(F.linear(x, self.weight))  # [num_tokens, out_features]
        return out if self.bias is None else out + self.bias

    @torch.no_grad()
    def load_weight(self, param_name: str, tensor: torch.Tensor) -> None:
        if param_name == "weight":
            tensor = tensor.narrow(1, self.span.start, self.span.size)
        _copy_checked(getattr(self, param_name), tensor, f"{param_name} of a row-parallel linear")


class _VocabRows:
    """Rows [span.start, span.end) of a [vocab, dim] weight, zero-padded to `part` rows."""

    weight: torch.Tensor
    span: Span

    @torch.no_grad()
    def load_weight(self, param_name: str, tensor: torch.Tensor) -> None:
        assert param_name == "weight", param_name
        if tensor.shape[0] < self.span.end or tensor.shape[1:] != self.weight.shape[1:]:
            raise ValueError(f"vocab-parallel weight: got {tuple(tensor.shape)}")
        self.weight[self.span.size :].zero_()
        _copy_checked(
            self.weight[: self.span.size], tensor.narrow(0, self.span.start, self.span.size), "weight"
        )


class VocabParallelEmbedding(_VocabRows, Embedding):
    def __init__(self, vocab_size: int, embedding_dim: int, scale: float | None, group: TPGroup) -> None:
        Embedding.__init__(self, padded_vocab_part(vocab_size, group.world_size), embedding_dim, scale)
        self.span, self.group = vocab_shard(vocab_size, group.world_size, group.rank), group

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.span.start
        outside = (local < 0) | (local >= self.span.size)  # [num_tokens]
        x = super().forward(local.masked_fill(outside, 0))  # [num_tokens, hidden_size]
        return self.group.all_reduce(x.masked_fill(outside[:, None], 0))


class VocabParallelLMHead(_VocabRows, nn.Linear):
    """An untied LM head's vocabulary rows; `LogitsGather` joins the ranks' logits."""

    def __init__(self, hidden_size: int, vocab_size: int, group: TPGroup) -> None:
        nn.Linear.__init__(self, hidden_size, padded_vocab_part(vocab_size, group.world_size), bias=False)
        self.span = vocab_shard(vocab_size, group.world_size, group.rank)


class LogitsGather(nn.Module):
    """[n, part] vocab-shard logits on every rank -> [n, vocab_size] (padding rows dropped)."""

    def __init__(self, vocab_size: int, group: TPGroup) -> None:
        super().__init__()
        self.vocab_size, self.group = vocab_size, group

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        # contiguous: the padding cut off leaves a strided view, and the sampler works in place.
        return self.group.all_gather_last_dim(logits)[:, : self.vocab_size].contiguous()
