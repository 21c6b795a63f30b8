"""Rotary position embeddings (NeoX / HF "rotate_half" layout) with HF's scaling variants.

cos/sin are computed once per forward from the positions (shared by every layer with the
same RoPE parameters) rather than cached per position: a table for 128K positions would
cost hundreds of MB, and the on-the-fly product matches HF's arithmetic exactly.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def rope_inv_freq(head_dim: int, base: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """[head_dim // 2] float32 inverse frequencies on the CPU, following transformers' ROPE_INIT_FUNCTIONS.

    On the CPU even inside `torch.device("meta")` (where models are built): meta tensors run Python
    reference kernels whose first use imports torch._dynamo, seconds in every process.
    """
    positions = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float()
    inv_freq = 1.0 / (base ** (positions / head_dim))
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type == "default":
        return inv_freq
    assert scaling is not None
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    raise ValueError(f"unsupported rope_scaling type {rope_type!r} (supported: default, linear, llama3)")


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are divided by `factor`, short ones kept, the band between interpolated.
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """positions -> (cos, sin), each [num_tokens, 1, head_dim], in the compute dtype.

    `sin` comes back with its first half negated so `apply_rotary` needs no negation:
    rotate_half(x) * sin == cat(x2, x1) * cat(-sin, sin).
    """

    def __init__(self, head_dim: int, base: float, scaling: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.base = base
        self.scaling = scaling
        inv_freq = rope_inv_freq(head_dim, base, scaling).to(torch.get_default_device())
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def reset_parameters(self) -> None:
        """Recompute `inv_freq` (needed after building on the meta device and `to_empty`)."""
        self.inv_freq = rope_inv_freq(self.head_dim, self.base, self.scaling).to(self.inv_freq.device)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if positions.is_cuda:
            from kvserve.models.layers import fused_ops

            if fused_ops.ENABLED and self.inv_freq.dtype == torch.float32:
                return fused_ops.rope_tables(positions, self.inv_freq, dtype)
        freqs = positions[:, None].float() * self.inv_freq  # [num_tokens, head_dim // 2]
        cos, sin = freqs.cos(), freqs.sin()
        cos = torch.cat((cos, cos), dim=-1).to(dtype)  # [num_tokens, head_dim]
        sin = torch.cat((-sin, sin), dim=-1).to(dtype)
        return cos[:, None, :], sin[:, None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [num_tokens, num_heads, head_dim] (may be a strided view) -> rotated copy, same shape."""
    if x.is_cuda:
        from kvserve.models.layers import fused_ops

        if fused_ops.ENABLED and cos.is_contiguous() and sin.is_contiguous():
            return fused_ops.rotary(x, cos, sin)
    half = x.shape[-1] // 2
    rotated = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
