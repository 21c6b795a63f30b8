"""Fused forms of a decoder layer: one kernel per projection, with the norms, the residual adds and
the activation folded into the projections around them, for the steps where that beats running the
layer's modules one by one.

- `GemvLayer`: one token on CUDA (single-stream decode) in four GEMV launches plus attention;
- `LowbitLayer`: fp32 CPU decode with every projection on lowbit_cpu's kernel (`--weight-quant`).

`fused_form` picks one when the layer's kernels are bound (CausalLMBase.select_kernels), from what
is fixed until the next binding: device, dtype, the projections' kind, the fused-op switch. At each
call a form checks only what changes from step to step and hands the other steps to the layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import nn

from kvserve.models.blocks import MLP, Attention
from kvserve.models.layers import lowbit_cpu
from kvserve.models.layers.attention.metadata import step_computes_prompt
from kvserve.models.layers.linear import MergedLinear
from kvserve.models.layers.norm import RMSNorm
from kvserve.models.layers.quant import WeightOnlyLinear

# A decoder layer's step: (x, cos, sin) -> the layer's output, both [num_tokens, hidden_size].
LayerStep = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class LayerNorms(NamedTuple):
    """A decoder layer's norms where the fused forms apply them: before attention, after it (Gemma;
    before the residual add), before the MLP, after it (Gemma)."""

    attn_in: RMSNorm
    attn_out: RMSNorm | None
    mlp_in: RMSNorm
    mlp_out: RMSNorm | None


def fused_form(
    attn: Attention, mlp: MLP, norms: LayerNorms, dtype: torch.dtype, layer: LayerStep
) -> GemvLayer | LowbitLayer | None:
    """The fused form of `layer` (made of these blocks and norms, computing in `dtype`), which runs
    `layer` itself for the steps it does not cover; None where no form fits."""
    if _fits_gemv(attn, mlp, norms, dtype):
        return GemvLayer(attn, mlp, norms, layer)
    if _fits_lowbit(attn, mlp, dtype):
        return LowbitLayer(attn, mlp, norms, layer)
    return None


def _projections(attn: Attention, mlp: MLP) -> tuple[nn.Module, ...]:
    return (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)


def _fits_gemv(attn: Attention, mlp: MLP, norms: LayerNorms, dtype: torch.dtype) -> bool:
    if not attn.qkv_proj.weight.is_cuda:
        return False
    from kvserve.models.layers import fused_ops, gemv  # Triton: imported on CUDA only

    # Plain nn.Linear only: weight-quantized or tensor-parallel projections keep their own kernels.
    return (
        fused_ops.ENABLED
        and gemv.fits_weight(attn.qkv_proj.weight, dtype)
        and all(type(m) in (nn.Linear, MergedLinear) for m in _projections(attn, mlp))
        and mlp.act_name in ("silu", "swish")
        and norms.attn_out is None
        and norms.mlp_out is None
        and norms.attn_in.offset == 0.0
        and norms.mlp_in.offset == 0.0
    )


def _fits_lowbit(attn: Attention, mlp: MLP, dtype: torch.dtype) -> bool:
    """fp32 with lowbit_cpu's packed weights in every projection (WeightOnlyLinear keeps them on the
    CPU), and the kernel has the MLP's activation."""
    return (
        dtype == torch.float32
        and all(isinstance(m, WeightOnlyLinear) and m.bits is not None for m in _projections(attn, mlp))
        and mlp.act_name in lowbit_cpu.ACTIVATIONS
    )


class GemvLayer:
    """One token in four GEMV launches plus attention: each norm is fused into the projection after
    it, the residual adds and SiLU-mul into the one before."""

    def __init__(self, attn: Attention, mlp: MLP, norms: LayerNorms, layer: LayerStep) -> None:
        from kvserve.models.layers.gemv import gemv

        self.attn, self.mlp, self.norms, self.layer = attn, mlp, norms, layer
        self._gemv = gemv

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if x.shape[0] != 1:
            return self.layer(x, cos, sin)
        gemv, attn, mlp = self._gemv, self.attn, self.mlp
        in_norm, post_norm = self.norms.attn_in, self.norms.mlp_in
        qkv = gemv(
            x, attn.qkv_proj.weight, bias=attn.qkv_proj.bias, norm_weight=in_norm.weight, eps=in_norm.eps
        )
        out = attn.attend_qkv(qkv, cos, sin)  # [1, H * D]
        h = gemv(out, attn.o_proj.weight, bias=attn.o_proj.bias, residual=x)  # x + attn
        act = gemv(h, mlp.gate_up_proj.weight, norm_weight=post_norm.weight, eps=post_norm.eps, gated=True)
        return gemv(act, mlp.down_proj.weight, residual=h)  # h + mlp


class LowbitLayer:
    """GemvLayer's four fused projections on the CPU's low-bit kernel (with Gemma's output norms
    fused in before the residual adds), for up to `max_rows` rows; never for a step that computes
    prompt tokens (metadata.step_computes_prompt), which runs on the dense weights."""

    def __init__(self, attn: Attention, mlp: MLP, norms: LayerNorms, layer: LayerStep) -> None:
        self.attn, self.mlp, self.norms, self.layer = attn, mlp, norms, layer
        self.max_rows = min(m.max_quant_rows for m in _projections(attn, mlp))

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.max_rows or step_computes_prompt():
            return self.layer(x, cos, sin)
        attn, mlp = self.attn, self.mlp
        attn_in, attn_out, mlp_in, mlp_out = self.norms
        qkv = attn.qkv_proj.lowbit(x, norm_weight=attn_in.scale(), eps=attn_in.eps)
        out = attn.attend_qkv(qkv, cos, sin)  # [num_tokens, H * D]
        h = attn.o_proj.lowbit(out, residual=x, **_post_norm(attn_out))  # x + attn
        act = mlp.gate_up_proj.lowbit(
            h, norm_weight=mlp_in.scale(), eps=mlp_in.eps, gated=True, act=mlp.act_name
        )
        return mlp.down_proj.lowbit(act, residual=h, **_post_norm(mlp_out))  # h + mlp


def _post_norm(norm: RMSNorm | None) -> dict[str, Any]:
    return {} if norm is None else {"post_norm": norm.scale(), "post_eps": norm.eps}
