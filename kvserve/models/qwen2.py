"""Qwen2 / Qwen2.5: Llama blocks with a bias on the q/k/v projections (not on o_proj)."""

from __future__ import annotations

from kvserve.models.blocks import Attention
from kvserve.models.common import CausalLMBase, DecoderLayer
from kvserve.models.config import ModelArchConfig
from kvserve.models.layers.attention.backend import AttentionBackend


class Qwen2ForCausalLM(CausalLMBase):
    def build_layer(self, arch: ModelArchConfig, layer_idx: int, backend: AttentionBackend) -> DecoderLayer:
        attn = Attention(arch, layer_idx, backend, qkv_bias=True, o_bias=False)
        return DecoderLayer(arch, layer_idx, attn)
