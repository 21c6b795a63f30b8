"""A one-token decode step of every layer in one C++ call (csrc/decode_stack.cpp), for fp32 CPU
models whose layers all run as a fused_layers.LowbitLayer (`--weight-quant` on an AVX2 CPU).

Why: that path is five C++ calls per layer, and around them each layer spent tens of microseconds
in Python (module dispatch, argument conversion): with 30 layers, several milliseconds of a ~20 ms
step. The C++ side makes the same calls in the same order, so the hidden states are bit for bit
the per-layer path's; the per-layer path stays the fallback (prefill, mixed batches, more rows
than the kernels take). Gemma 3's layers (four norms, GELU-tanh, q/k norms, sliding and global
layers with their own RoPE tables) run in it too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from kvserve.models.fused_layers import LowbitLayer
from kvserve.models.layers import cpu_ext, lowbit_cpu
from kvserve.models.layers.attention.cpu_decode import CpuDecodeKernel
from kvserve.models.layers.attention.metadata import get_attention_metadata

RopeTables = Mapping[str, tuple[torch.Tensor, torch.Tensor]]  # layer type -> (cos, sin)


class CpuDecodeStack:
    def __init__(self, stack: Any, layer_types: list[str], max_rows: int) -> None:
        self._stack = stack  # the extension's DecodeStack, holding every layer's tensors
        self._layer_types = layer_types  # the RoPE table of each index a layer names
        self._max_rows = max_rows

    @classmethod
    def build(cls, layers: Sequence[LowbitLayer], layer_types: Sequence[str]) -> CpuDecodeStack | None:
        """The stack of `layers` (with the RoPE table each reads), or None where the one call cannot
        run them: no kernels, attention it does not cover."""
        ext = cpu_ext.load()
        if ext is None or not layers:
            return None
        attn0 = layers[0].attn
        stack = ext.DecodeStack(attn0.num_heads, attn0.num_kv_heads)
        tables = sorted(set(layer_types))
        for layer, layer_type in zip(layers, layer_types, strict=True):
            attn, mlp = layer.attn, layer.mlp
            if not isinstance(attn.fused_decode, CpuDecodeKernel):  # the stack's attention is that kernel
                return None
            linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
            attn_in, attn_out, mlp_in, mlp_out = layer.norms
            out_eps = {n.eps for n in (attn_out, mlp_out) if n is not None}
            q_norm, k_norm = attn.q_norm, attn.k_norm
            if len(out_eps) > 1 or (q_norm is not None and (k_norm is None or k_norm.eps != q_norm.eps)):
                return None  # one eps for both output norms, one for q and k (as in every family here)
            stack.add_layer(
                [(m.qweight, m.scales, m.bias, m.bits, m.packed) for m in linears],
                attn_in.scale(), attn_in.eps, mlp_in.scale(), mlp_in.eps,
                attn.kv_cache, attn.scale, attn.sliding_window or 0, lowbit_cpu.ACTIVATIONS[mlp.act_name],
                None if attn_out is None else attn_out.scale(),
                None if mlp_out is None else mlp_out.scale(),
                out_eps.pop() if out_eps else 1e-6,
                None if q_norm is None else q_norm.scale(),
                None if k_norm is None else k_norm.scale(),
                1e-6 if q_norm is None else q_norm.eps,
                tables.index(layer_type),
            )  # fmt: skip
        return cls(stack, tables, min(layer.max_rows for layer in layers))

    def forward(self, x: torch.Tensor, rope: RopeTables) -> torch.Tensor | None:
        """The last layer's output [num_tokens, hidden] for an all-decode batch; None otherwise (the
        caller runs the layers one by one)."""
        num_tokens = x.shape[0]
        metadata = get_attention_metadata()
        tables = [rope[layer_type] for layer_type in self._layer_types]
        if (
            num_tokens > self._max_rows
            or not 0 < metadata.num_decodes == metadata.num_seqs == num_tokens
            or metadata.computes_prompt  # a one-token prompt tail is a "decode" by shape only
            or not all(cos.is_contiguous() and sin.is_contiguous() for cos, sin in tables)
        ):
            return None
        return self._stack.forward(
            x, [cos for cos, _ in tables], [sin for _, sin in tables],
            metadata.slot_mapping, metadata.block_tables.contiguous(), metadata.seq_lens,
        )  # fmt: skip
