"""The attention backend interface: what an attention layer asks of a paged-KV kernel.

A backend is stateless with respect to the model (one instance is shared by every layer);
it may memoize per-batch work (masks, gathered block tables) keyed on the identity of
the current `AttentionMetadata`, since every layer of one forward sees the same batch.
The one exception is the torch backend's CPU decode workspace, which keeps per-sequence KV
copies from one forward to the next (keyed by `AttentionMetadata.seq_ids`).

Beyond `write_kv` and `attend`, a backend may offer fused kernels and other abilities: each is
an optional protocol below, which callers test with `isinstance` when they bind their kernels
(the layer when the backend, its cache or the model's dtype is set; the runner at start-up),
never at every call.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

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


class LayerAttention(NamedTuple):
    """One attention layer as a fused kernel sees it."""

    num_heads: int
    num_kv_heads: int
    scale: float
    sliding_window: int | None
    q_norm: torch.Tensor | None  # [head_dim] fp32 RMSNorm scales (RMSNorm.scale()) before RoPE, or None
    k_norm: torch.Tensor | None
    norm_eps: float


class DecodeKernel(Protocol):
    def __call__(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor | None:
        """Projected qkv [num_tokens, (H + 2 KV) * D] -> attention output [num_tokens, H * D] of an
        all-decode step, the KV written; None for a step it does not cover (the layer then runs
        the unfused ops)."""
        ...


class RotaryKVKernel(Protocol):
    def __call__(
        self,
        qk: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        *,
        v: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> torch.Tensor:
        """RoPE of q and k ([num_tokens, H + KV, D], the keys last) -> the rotated copy; the rotated
        keys and `v` ([num_tokens, KV, D]) are also written to the cache at `slot_mapping`."""
        ...


@runtime_checkable
class FusesDecode(Protocol):
    """A backend with one kernel for everything between qkv_proj and o_proj of a decode step."""

    def decode_kernel(
        self, layer: LayerAttention, dtype: torch.dtype, cache: torch.Tensor
    ) -> DecodeKernel | None:
        """The kernel for `layer` computing in `dtype` over `cache`; None where it does not apply."""
        ...


@runtime_checkable
class FusesRotaryKVWrite(Protocol):
    """A backend that applies RoPE and writes the KV in one launch."""

    def rotary_kv_kernel(self, dtype: torch.dtype, cache: torch.Tensor) -> RotaryKVKernel | None:
        """The kernel for a layer computing in `dtype` over `cache`; None where it does not apply."""
        ...


@runtime_checkable
class PrecompilesKernels(Protocol):
    """A backend whose kernels compile a variant per launch shape, which it can compile ahead."""

    def precompile(self, cache: torch.Tensor, num_heads: int, *, scale: float, window: int | None) -> None:
        """Compile every variant a layer of this shape may launch (engine/warmup.py)."""
        ...


@runtime_checkable
class CapturesDecode(Protocol):
    """A backend whose decode a CUDA graph can capture: it reads only device tensors, and its split
    count, which would follow host sequence lengths, is pinned per graph while capturing."""

    num_sms: int
    graph_num_splits: int | None  # set by the graph runner while it captures; None otherwise
