"""The attention backend interface: what an attention layer asks of a paged-KV kernel.

A backend is stateless with respect to the model (one instance is shared by every layer);
it may memoize per-batch work (masks, gathered block tables) keyed on the identity of
the current `AttentionMetadata`, since every layer of one forward sees the same batch.
The one exception is the torch backend's CPU decode workspace, which keeps per-sequence KV
copies from one forward to the next (keyed by `AttentionMetadata.seq_ids`).
"""

from __future__ import annotations

from typing import Protocol

import torch

from kvserve.models.layers.attention.metadata import AttentionMetadata


class AttentionBackend(Protocol):
    name: str

    def write_kv(
        self, cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        """Store this step's keys/values in the paged cache.

        cache: [2, num_blocks, block_size, num_kv_heads, head_dim]; k, v: [num_tokens, num_kv_heads,
        head_dim] (may be strided views); slot_mapping: [num_tokens] int64 flat slot per token.
        """
        ...

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cache: torch.Tensor,
        metadata: AttentionMetadata,
        *,
        scale: float,
        sliding_window: int | None = None,
    ) -> torch.Tensor:
        """Causal attention of every query over its sequence's cached keys (after `write_kv`).

        q: [num_tokens, num_heads, head_dim]; k, v: this step's keys/values, the same ones just
        written (a backend may use them instead of re-reading the cache for fresh prefills).
        A query at absolute position i sees key j iff j <= i and, with a window w, i - w < j.
        Returns [num_tokens, num_heads, head_dim] in q's dtype.
        """
        ...
