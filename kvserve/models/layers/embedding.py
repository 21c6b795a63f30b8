"""Token embedding, optionally scaled (Gemma multiplies by sqrt(hidden_size))."""

from __future__ import annotations

import functools

import torch
from torch import nn


@functools.cache
def _rounded(value: float, dtype: torch.dtype) -> float:
    # HF keeps the scale as a tensor cast to the weight dtype, so in bf16 it is sqrt(H) rounded to bf16.
    return torch.tensor(value, dtype=torch.float32).to(dtype).item()


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, scale: float | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim))
        self.scale = scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = nn.functional.embedding(input_ids, self.weight)  # [num_tokens, hidden_size]
        if self.scale is None:
            return x
        return x * _rounded(self.scale, self.weight.dtype)
