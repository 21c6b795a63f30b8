"""Gemma 3 (text): the deltas from the Llama blocks.

- embeddings scaled by sqrt(hidden_size), the scale rounded to the compute dtype (as HF);
- every RMSNorm scales by (1 + w), in fp32;
- four norms per layer: the attention and MLP outputs are normalized before the residual add;
- q/k RMSNorm per head; attention scale query_pre_attn_scalar ** -0.5;
- sliding-window layers (per `layer_types`) use RoPE base `rope_local_base_freq` without
  scaling; global layers use `rope_theta` with `rope_scaling` (linear, factor 8 in 4B+);
- GELU (tanh) gated MLP; optional final logit soft-capping (handled by the base).
"""

from __future__ import annotations

import torch

from kvserve.models.blocks import Attention
from kvserve.models.common import CausalLMBase, DecoderLayer
from kvserve.models.config import LayerType, ModelArchConfig
from kvserve.models.fused_layers import LayerNorms
from kvserve.models.layers.attention.backend import AttentionBackend
from kvserve.models.layers.embedding import Embedding
from kvserve.models.layers.norm import RMSNorm
from kvserve.models.layers.rotary import RotaryEmbedding

GEMMA_NORM_OFFSET = 1.0

# Multimodal (Gemma3ForConditionalGeneration) checkpoints nest the text model; the vision
# tower and projector are not used by a text-only server.
_TEXT_PREFIXES = ("model.language_model.", "language_model.model.")
_SKIPPED_PREFIXES = (
    "vision_tower.",
    "multi_modal_projector.",
    "model.vision_tower.",
    "model.multi_modal_projector.",
)


class Gemma3DecoderLayer(DecoderLayer):
    """DecoderLayer with Gemma's four norms: its forward below, and where the fused forms (the fp32
    low-bit decode, the one-call decode stack) apply them through `norms`."""

    def __init__(self, arch: ModelArchConfig, layer_idx: int, backend: AttentionBackend) -> None:
        bias = arch.attention_bias
        attn = Attention(
            arch, layer_idx, backend, qkv_bias=bias, o_bias=bias, qk_norm_offset=GEMMA_NORM_OFFSET
        )
        super().__init__(arch, layer_idx, attn)
        dim, eps = arch.hidden_size, arch.rms_norm_eps
        self.input_layernorm = RMSNorm(dim, eps, GEMMA_NORM_OFFSET)
        self.post_attention_layernorm = RMSNorm(dim, eps, GEMMA_NORM_OFFSET)
        self.pre_feedforward_layernorm = RMSNorm(dim, eps, GEMMA_NORM_OFFSET)
        self.post_feedforward_layernorm = RMSNorm(dim, eps, GEMMA_NORM_OFFSET)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))

    def norms(self) -> LayerNorms:
        return LayerNorms(
            self.input_layernorm,
            self.post_attention_layernorm,
            self.pre_feedforward_layernorm,
            self.post_feedforward_layernorm,
        )


class Gemma3ForCausalLM(CausalLMBase):
    def build_layer(self, arch: ModelArchConfig, layer_idx: int, backend: AttentionBackend) -> DecoderLayer:
        return Gemma3DecoderLayer(arch, layer_idx, backend)

    def build_embedding(self, arch: ModelArchConfig) -> Embedding:
        return Embedding(arch.vocab_size, arch.hidden_size, scale=arch.hidden_size**0.5)

    def build_norm(self, arch: ModelArchConfig, dim: int) -> RMSNorm:
        return RMSNorm(dim, arch.rms_norm_eps, GEMMA_NORM_OFFSET)

    def build_rotary(self, arch: ModelArchConfig, layer_type: LayerType) -> RotaryEmbedding:
        if layer_type == "sliding_attention":
            assert arch.rope_local_base_freq is not None
            return RotaryEmbedding(arch.head_dim, arch.rope_local_base_freq, None)
        return RotaryEmbedding(arch.head_dim, arch.rope_theta, arch.rope_scaling_dict)

    def strip_hf_prefix(self, hf_name: str) -> str | None:
        if hf_name.startswith(_SKIPPED_PREFIXES):
            return None
        for prefix in _TEXT_PREFIXES:
            if hf_name.startswith(prefix):
                return "model." + hf_name[len(prefix) :]
        if hf_name.startswith("language_model.lm_head."):
            return hf_name[len("language_model.") :]
        return hf_name
