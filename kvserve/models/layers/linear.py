"""A Linear that holds several HF projections stacked along its output dim.

Fusing q/k/v (and gate/up) turns three (two) GEMMs into one per layer, which matters
on the CPU decode path where per-op overhead dominates. Checkpoints keep the HF names;
the loader routes each HF tensor to its row range with `load_shard`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class MergedLinear(nn.Linear):
    def __init__(self, in_features: int, out_sizes: Sequence[int], bias: bool) -> None:
        super().__init__(in_features, sum(out_sizes), bias=bias)
        self.out_sizes = tuple(out_sizes)

    def shard_rows(self, shard: int) -> tuple[int, int]:
        """(start, size) of shard `shard` along the output dim."""
        return sum(self.out_sizes[:shard]), self.out_sizes[shard]

    @torch.no_grad()
    def load_shard(self, param_name: str, shard: int, tensor: torch.Tensor) -> None:
        start, size = self.shard_rows(shard)
        param: torch.Tensor = getattr(self, param_name)
        target = param.narrow(0, start, size)
        if target.shape != tensor.shape:
            expected, got = tuple(target.shape), tuple(tensor.shape)
            raise ValueError(f"shard {shard} of {param_name}: expected {expected}, got {got}")
        target.copy_(tensor)
