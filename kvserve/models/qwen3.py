"""Qwen3 (dense): Llama blocks plus a per-head RMSNorm on q and k before RoPE."""

from __future__ import annotations

from kvserve.models.blocks import Attention
from kvserve.models.common import CausalLMBase, DecoderLayer
from kvserve.models.config import ModelArchConfig
from kvserve.models.layers.attention.backend import AttentionBackend


class Qwen3ForCausalLM(CausalLMBase):
    def build_layer(self, arch: ModelArchConfig, layer_idx: int, backend: AttentionBackend) -> DecoderLayer:
        bias = arch.attention_bias
        attn = Attention(arch, layer_idx, backend, qkv_bias=bias, o_bias=bias, qk_norm_offset=0.0)
        return DecoderLayer(arch, layer_idx, attn)
