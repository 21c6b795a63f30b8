"""Rotary position embeddings (NeoX / HF "rotate_half" layout) with HF's scaling variants.

cos/sin are computed once per forward from the positions (shared by every layer with the
same RoPE parameters) rather than cached per position: a table for 128K positions would
cost hundreds of MB, and the on-the-fly product matches HF's arithmetic exactly.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import nn

from kvserve.models.rope_scaling import TRAINED_ROPE_OFFSET


class RopeInit(NamedTuple):
    inv_freq: torch.Tensor  # [head_dim // 2] float32, on the CPU
    attention_factor: float  # multiplies cos and sin (YaRN's mscale; 1.0 for the other types)


def rope_init(head_dim: int, base: float, scaling: dict[str, Any] | None) -> RopeInit:
    """Inverse frequencies and attention factor, following transformers' ROPE_INIT_FUNCTIONS.

    On the CPU even inside `torch.device("meta")` (where models are built): meta tensors run Python
    reference kernels whose first use imports torch._dynamo, seconds in every process.
    """
    positions = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float()
    inv_freq = 1.0 / (base ** (positions / head_dim))
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type == "default":
        return RopeInit(inv_freq, 1.0)
    assert scaling is not None
    if rope_type == "linear":
        return RopeInit(inv_freq / scaling["factor"], 1.0)
    if rope_type == "llama3":
        return RopeInit(_llama3_inv_freq(inv_freq, scaling), 1.0)
    if rope_type == "yarn":
        return _yarn(head_dim, base, scaling)
    raise ValueError(
        f"unsupported rope_scaling type {rope_type!r} (supported: default, linear, llama3, yarn)"
    )


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


def _yarn(head_dim: int, base: float, scaling: dict[str, Any]) -> RopeInit:
    """transformers' `_compute_yarn_parameters`: low frequencies (wavelengths longer than the original
    context) are interpolated by `factor`, high ones kept, the band between blended by a linear ramp
    over [beta_slow, beta_fast] rotations; cos/sin are scaled by the attention factor (mscale)."""
    factor = float(scaling["factor"])
    original = scaling["original_max_position_embeddings"]
    attention_factor = scaling.get("attention_factor")
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim))
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(num_rotations: float) -> float:
        # The dimension whose wavelength fits `num_rotations` times into the original context.
        return (head_dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # prevent a division by zero, as transformers does
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, head_dim, 2, device="cpu").float() / head_dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    extrapolation_share = 1 - ramp
    inv_freq = (
        inv_freq_interpolation * (1 - extrapolation_share) + inv_freq_extrapolation * extrapolation_share
    )
    return RopeInit(inv_freq, float(attention_factor))


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN paper eq. 21: 0.1 * mscale * ln(scale) + 1."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


class RotaryEmbedding(nn.Module):
    """positions -> (cos, sin), each [num_tokens, 1, head_dim], in the compute dtype.

    `sin` comes back with its first half negated so `apply_rotary` needs no negation:
    rotate_half(x) * sin == cat(x2, x1) * cat(-sin, sin). Both carry the attention factor (YaRN),
    so every consumer of the tables (the torch path, the fused Triton RoPE and RoPE+KV write, the
    one-token GEMV layer) applies it.
    """

    def __init__(self, head_dim: int, base: float, scaling: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.base = base
        self.scaling = scaling
        inv_freq, self.attention_factor = rope_init(head_dim, base, scaling)
        self.register_buffer("inv_freq", inv_freq.to(torch.get_default_device()), persistent=False)

    def reset_parameters(self) -> None:
        """Recompute `inv_freq` (needed after building on the meta device and `to_empty`)."""
        self.inv_freq = rope_init(self.head_dim, self.base, self.scaling).inv_freq.to(self.inv_freq.device)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if positions.is_cuda:
            from kvserve.models.layers import fused_ops

            if fused_ops.ENABLED and self.inv_freq.dtype == torch.float32:
                return fused_ops.rope_tables(positions, self.inv_freq, dtype, self.attention_factor)
        return self._tables(positions[:, None].float() * self.inv_freq, dtype)

    def _tables(self, freqs: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """freqs [num_tokens, head_dim // 2] -> (cos, sin) as `forward` returns them."""
        cos, sin = freqs.cos(), freqs.sin()
        if self.attention_factor != 1.0:  # in fp32 before the cast, as transformers does
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        cos = torch.cat((cos, cos), dim=-1).to(dtype)  # [num_tokens, head_dim]
        sin = torch.cat((-sin, sin), dim=-1).to(dtype)
        return cos[:, None, :], sin[:, None, :]


class MRotaryEmbedding(RotaryEmbedding):
    """M-RoPE (Qwen2.5-VL): each token has three positions (t, h, w), and the rotary frequencies
    are split into three sections, each turned by one of them (transformers'
    `Qwen2_5_VLRotaryEmbedding`). Positions [num_tokens] are text, all three equal: the same tables
    as plain RoPE, so text steps take `RotaryEmbedding`'s path (and its fused CUDA kernel)."""

    def __init__(
        self, head_dim: int, base: float, scaling: dict[str, Any] | None, section: tuple[int, ...]
    ) -> None:
        super().__init__(head_dim, base, scaling)
        if sum(section) != head_dim // 2:
            raise ValueError(f"mrope_section {section} must sum to head_dim / 2 = {head_dim // 2}")
        self.section = section

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if positions.dim() == 1:
            return super().forward(positions, dtype)
        freqs = positions[..., None].float() * self.inv_freq  # [3, num_tokens, head_dim // 2]
        parts = freqs.split(list(self.section), dim=-1)
        return self._tables(torch.cat([part[i % 3] for i, part in enumerate(parts)], dim=-1), dtype)


class OnDemandRotary(nn.Module):
    """Two RoPE regimes in one batch: rows whose positions carry TRAINED_ROPE_OFFSET take `trained`'s
    tables (the model as trained), the others `scaled`'s (YaRN, attention factor included). Both are
    computed and one is picked per row, so each row's tables are bit for bit its regime's alone, on
    every device and kernel that consumes the tables."""

    def __init__(self, scaled: RotaryEmbedding, trained: RotaryEmbedding) -> None:
        super().__init__()
        self.scaled = scaled
        self.trained = trained

    def reset_parameters(self) -> None:
        self.scaled.reset_parameters()
        self.trained.reset_parameters()

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        is_trained = positions >= TRAINED_ROPE_OFFSET  # [num_tokens], or [3, num_tokens] (M-RoPE)
        if not positions.is_cuda:  # the host looks without a device sync: one table for one regime
            if not is_trained.any():
                return self.scaled(positions, dtype)
            if is_trained.all():
                return self.trained(positions - TRAINED_ROPE_OFFSET, dtype)
        plain = positions - is_trained * TRAINED_ROPE_OFFSET
        cos, sin = self.scaled(plain, dtype)
        cos_trained, sin_trained = self.trained(plain, dtype)
        rows = (is_trained if positions.dim() == 1 else is_trained[0])[:, None, None]
        return torch.where(rows, cos_trained, cos), torch.where(rows, sin_trained, sin)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [num_tokens, num_heads, head_dim] (may be a strided view) -> rotated copy, same shape."""
    if x.is_cuda:
        from kvserve.models.layers import fused_ops

        if fused_ops.ENABLED and cos.is_contiguous() and sin.is_contiguous():
            return fused_ops.rotary(x, cos, sin)
    half = x.shape[-1] // 2
    rotated = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
