"""A one-token decode step of every layer in one C++ call (csrc/decode_stack.cpp), for fp32 CPU
models whose layers all run DecoderLayer._forward_lowbit (`--weight-quant` on an AVX2 CPU).

Why: that path is five C++ calls per layer, and around them each layer spent tens of microseconds
in Python (module dispatch, the path checks, argument conversion): with 30 layers, several
milliseconds of a ~20 ms step. The C++ side makes the same calls in the same order, so the hidden
states are bit for bit the per-layer path's; the per-layer path stays the fallback (prefill,
mixed batches, sliding and global layers in one model, more rows than the kernels take).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from kvserve.models.layers import cpu_ext
from kvserve.models.layers.attention.metadata import get_attention_metadata

if TYPE_CHECKING:
    from kvserve.models.common import DecoderLayer, RopeTables


class CpuDecodeStack:
    def __init__(self, stack: Any, layer_type: str, max_rows: int) -> None:
        self._stack = stack  # the extension's DecodeStack, holding every layer's tensors
        self._layer_type = layer_type
        self._max_rows = max_rows

    @classmethod
    def build(cls, layers: list[DecoderLayer]) -> CpuDecodeStack | None:
        """The stack of `layers` (each `is_lowbit()`), or None where the one call cannot run them:
        no kernels, layer types that need different RoPE tables, attention it does not cover."""
        ext = cpu_ext.load()
        if ext is None or not layers or len({layer.layer_type for layer in layers}) != 1:
            return None
        attn0 = layers[0].self_attn
        stack = ext.DecodeStack(attn0.num_heads, attn0.num_kv_heads)
        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            cache = attn.kv_cache
            if (
                attn.q_norm is not None
                or attn.backend.name != "torch_ref"
                or cache is None
                or cache.dtype != torch.float32
                or not cache.is_contiguous()
            ):
                return None
            linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
            in_norm, post_norm = layer.input_layernorm, layer.post_attention_layernorm
            stack.add_layer(
                [(m.qweight, m.scales, m.bias, m.bits, m.packed) for m in linears],
                in_norm.weight, in_norm.eps, post_norm.weight, post_norm.eps,
                cache, attn.scale, attn.sliding_window or 0,
            )  # fmt: skip
        return cls(stack, layers[0].layer_type, min(layer.max_lowbit_rows() for layer in layers))

    def forward(self, x: torch.Tensor, rope: RopeTables) -> torch.Tensor | None:
        """The last layer's output [num_tokens, hidden] for an all-decode batch; None otherwise (the
        caller runs the layers one by one)."""
        num_tokens = x.shape[0]
        metadata = get_attention_metadata()
        cos, sin = rope[self._layer_type]
        if (
            num_tokens > self._max_rows
            or not 0 < metadata.num_decodes == metadata.num_seqs == num_tokens
            or metadata.computes_prompt  # a one-token prompt tail is a "decode" by shape only
            or not (cos.is_contiguous() and sin.is_contiguous())
        ):
            return None
        return self._stack.forward(
            x, cos, sin, metadata.slot_mapping, metadata.block_tables.contiguous(), metadata.seq_lens
        )
