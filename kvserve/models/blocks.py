"""The two blocks of a decoder layer: GQA attention over the paged cache and the gated MLP.

Module attribute names follow HF checkpoints (`self_attn.o_proj.weight`, `mlp.down_proj.weight`);
q/k/v and gate/up are fused into `qkv_proj` and `gate_up_proj` (see `CausalLMBase.map_hf_name`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from kvserve.models.config import ModelArchConfig
from kvserve.models.layers.activation import get_gated_activation
from kvserve.models.layers.attention.backend import (
    AttentionBackend,
    DecodeKernel,
    FusesDecode,
    FusesRotaryKVWrite,
    LayerAttention,
    RotaryKVKernel,
)
from kvserve.models.layers.attention.metadata import get_attention_metadata
from kvserve.models.layers.linear import MergedLinear
from kvserve.models.layers.norm import RMSNorm
from kvserve.models.layers.rotary import apply_rotary


class Attention(nn.Module):
    def __init__(
        self,
        arch: ModelArchConfig,
        layer_idx: int,
        backend: AttentionBackend,
        *,
        qkv_bias: bool,
        o_bias: bool,
        qk_norm_offset: float | None = None,  # None: no q/k norm; else the RMSNorm weight offset
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            arch.num_attention_heads,
            arch.num_key_value_heads,
            arch.head_dim,
        )
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = MergedLinear(arch.hidden_size, (q_size, kv_size, kv_size), bias=qkv_bias)
        self.o_proj = nn.Linear(q_size, arch.hidden_size, bias=o_bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if qk_norm_offset is not None:
            self.q_norm = RMSNorm(self.head_dim, arch.rms_norm_eps, qk_norm_offset)
            self.k_norm = RMSNorm(self.head_dim, arch.rms_norm_eps, qk_norm_offset)
        self.layer_type = arch.layer_type(layer_idx)
        self.sliding_window = arch.sliding_window if self.layer_type == "sliding_attention" else None
        self.scale = (arch.query_pre_attn_scalar or self.head_dim) ** -0.5
        self.backend = backend
        self.kv_cache: torch.Tensor | None = None  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        # The backend's fused kernels for this layer, chosen by bind_kernels; until then the unfused ops.
        self.fused_decode: DecodeKernel | None = None
        self._rotary_kv: RotaryKVKernel | None = None
        self._rope_and_write_kv = self._rope_then_write

    def bind_kernels(self, dtype: torch.dtype) -> None:
        """Take the backend's fused kernels that fit this layer computing in `dtype` over its cache;
        the model calls it whenever the backend, the cache or what the kernels depend on changes
        (CausalLMBase.select_kernels)."""
        backend, cache = self.backend, self.kv_cache
        self.fused_decode = self._rotary_kv = None
        self._rope_and_write_kv = self._rope_then_write
        if cache is None:
            return
        if isinstance(backend, FusesDecode):
            self.fused_decode = backend.decode_kernel(self._as_fused(), dtype, cache)
        if isinstance(backend, FusesRotaryKVWrite) and self.q_norm is None:
            self._rotary_kv = backend.rotary_kv_kernel(dtype, cache)
            if self._rotary_kv is not None:
                self._rope_and_write_kv = self._fused_rope_write

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.o_proj(self.attend_qkv(self.qkv_proj(x), cos, sin))

    def attend_qkv(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Projected [num_tokens, (H + 2 KV) * D] -> attention output [num_tokens, H * D]: (q/k norm,)
        RoPE, the KV write and paged attention (everything between qkv_proj and o_proj)."""
        assert self.kv_cache is not None, "bind_kv_caches() before forward"
        metadata = get_attention_metadata()
        if self.fused_decode is not None:
            out = self.fused_decode(qkv, cos, sin, metadata)  # None for a step with prompt rows
            if out is not None:
                return out
        num_tokens = qkv.shape[0]
        qkv = qkv.view(num_tokens, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        q, k, v = self._rope_and_write_kv(qkv, cos, sin, metadata.slot_mapping)
        out = self.backend.attend(
            q, k, v, self.kv_cache, metadata, scale=self.scale, sliding_window=self.sliding_window
        )  # [num_tokens, num_heads, head_dim]
        return out.reshape(num_tokens, self.num_heads * self.head_dim)

    # -- RoPE and the KV write: qkv [num_tokens, H + 2 KV, D] -> q, k, v, the KV in the cache -------

    def _rope_then_write(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor
    ) -> QKV:
        num_heads, num_kv_heads = self.num_heads, self.num_kv_heads
        v = qkv[:, num_heads + num_kv_heads :]
        if self.q_norm is None or self.k_norm is None:
            # One rotary pass over q and k together: they are adjacent heads of the fused output.
            qk = apply_rotary(qkv[:, : num_heads + num_kv_heads], cos, sin)
            q, k = qk[:, :num_heads], qk[:, num_heads:]
        else:
            q = apply_rotary(self.q_norm(qkv[:, :num_heads]), cos, sin)
            k = apply_rotary(self.k_norm(qkv[:, num_heads : num_heads + num_kv_heads]), cos, sin)
        self.backend.write_kv(self.kv_cache, k, v, slots)
        return QKV(q, k, v)

    def _fused_rope_write(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor
    ) -> QKV:
        """The backend's RoPE + KV-write kernel (layers without q/k norms)."""
        assert self._rotary_kv is not None
        num_heads, num_kv_heads = self.num_heads, self.num_kv_heads
        v = qkv[:, num_heads + num_kv_heads :]
        qk = self._rotary_kv(qkv[:, : num_heads + num_kv_heads], cos, sin, v=v, slot_mapping=slots)
        return QKV(qk[:, :num_heads], qk[:, num_heads:], v)

    def _as_fused(self) -> LayerAttention:
        q_norm, k_norm = self.q_norm, self.k_norm
        return LayerAttention(
            self.num_heads, self.num_kv_heads, self.scale, self.sliding_window,
            None if q_norm is None else q_norm.scale(), None if k_norm is None else k_norm.scale(),
            1e-6 if q_norm is None else q_norm.eps,
        )  # fmt: skip


class QKV(NamedTuple):
    q: torch.Tensor  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor  # [num_tokens, num_kv_heads, head_dim]


class MLP(nn.Module):
    def __init__(self, arch: ModelArchConfig) -> None:
        super().__init__()
        self.gate_up_proj = MergedLinear(arch.hidden_size, (arch.intermediate_size,) * 2, bias=False)
        self.down_proj = nn.Linear(arch.intermediate_size, arch.hidden_size, bias=False)
        self.act_name = arch.hidden_act
        self.act = get_gated_activation(arch.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))
