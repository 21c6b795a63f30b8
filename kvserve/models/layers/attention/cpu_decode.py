"""One-token decodes on the CPU in fp32: RoPE, the KV write and paged attention reading the
cache's blocks in place, in one C++ call per layer (csrc/decode_attention.cpp). The cache is fp32
or fp16 (the default under fp32: kv_dtype.py).

With q/k norms (Qwen3, Gemma 3) the per-head RMSNorm of q and k comes first, in the same call.
The torch path (rotary.py + TorchRefBackend) stays the oracle and covers everything else:
prefill chunks, mixed batches, bf16, CPUs without the kernels.
"""

from __future__ import annotations

from typing import Any

import torch

from kvserve.models.layers import cpu_ext
from kvserve.models.layers.attention.backend import LayerAttention
from kvserve.models.layers.attention.metadata import AttentionMetadata


class CpuDecodeKernel:
    """The kernel bound to one layer and its cache (TorchRefBackend.decode_kernel), for a layer that
    `supports` admits; what it checks at each call is what changes from step to step."""

    def __init__(self, layer: LayerAttention, cache: torch.Tensor) -> None:
        self.layer, self.cache = layer, cache
        self._ext: Any = cpu_ext.load()

    @staticmethod
    def supports(dtype: torch.dtype, cache: torch.Tensor) -> bool:
        """A layer computing in `dtype` over `cache` can take the kernel: fp32 on the CPU, an fp32 or
        fp16 contiguous cache, and the kernels built for this CPU."""
        return (
            cache.device.type == "cpu"
            and dtype == torch.float32
            and cache.dtype in (torch.float32, torch.float16)
            and cache.is_contiguous()
            and cpu_ext.load() is not None
        )

    def __call__(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor | None:
        num_tokens = qkv.shape[0]
        if not 0 < metadata.num_decodes == metadata.num_seqs == num_tokens or not (
            qkv.is_contiguous() and cos.is_contiguous() and sin.is_contiguous()
        ):
            return None
        layer = self.layer
        return self._ext.decode_attention(
            qkv, cos, sin, self.cache, metadata.slot_mapping, metadata.block_tables.contiguous(),
            metadata.seq_lens, layer.num_heads, layer.num_kv_heads, layer.scale, layer.sliding_window or 0,
            layer.q_norm, layer.k_norm, layer.norm_eps,
        )  # fmt: skip


def attend_qkv(
    qkv: torch.Tensor,  # [num_tokens, (H + 2 KV) * D]
    cos: torch.Tensor,  # [num_tokens, 1, D]
    sin: torch.Tensor,
    cache: torch.Tensor,  # [2, num_blocks, block_size, KV, D]
    metadata: AttentionMetadata,
    num_heads: int,
    num_kv_heads: int,
    scale: float,
    sliding_window: int | None,
    q_norm: torch.Tensor | None = None,  # [D] fp32 RMSNorm scales (RMSNorm.scale()), or None
    k_norm: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
) -> torch.Tensor | None:
    """One call without a bound kernel: the attention output [num_tokens, H * D] of an all-decode
    fp32 CPU batch; None where the kernel does not apply."""
    if qkv.device.type != "cpu" or not CpuDecodeKernel.supports(qkv.dtype, cache):
        return None
    layer = LayerAttention(num_heads, num_kv_heads, scale, sliding_window, q_norm, k_norm, norm_eps)
    return CpuDecodeKernel(layer, cache)(qkv, cos, sin, metadata)
