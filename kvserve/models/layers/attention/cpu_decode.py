"""One-token decodes on the CPU in fp32: RoPE, the KV write and paged attention reading the
cache's blocks in place, in one C++ call per layer (csrc/decode_attention.cpp). The cache is fp32
or fp16 (the default under fp32: kv_dtype.py).

With q/k norms (Qwen3, Gemma 3) the per-head RMSNorm of q and k comes first, in the same call.
The torch path (rotary.py + TorchRefBackend) stays the oracle and covers everything else:
prefill chunks, mixed batches, bf16, CPUs without the kernels.
"""

from __future__ import annotations

import torch

from kvserve.models.layers import cpu_ext
from kvserve.models.layers.attention.metadata import AttentionMetadata


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
    """Attention output [num_tokens, H * D] of an all-decode fp32 CPU batch; None where the
    kernel does not apply (the caller then takes the torch path)."""
    num_tokens = qkv.shape[0]
    if (
        qkv.device.type != "cpu"
        or qkv.dtype != torch.float32
        or cache.dtype not in (torch.float32, torch.float16)
        or not 0 < metadata.num_decodes == metadata.num_seqs == num_tokens
        or not all(t.is_contiguous() for t in (qkv, cos, sin, cache))
    ):
        return None
    ext = cpu_ext.load()
    if ext is None:
        return None
    return ext.decode_attention(
        qkv,
        cos,
        sin,
        cache,
        metadata.slot_mapping,
        metadata.block_tables.contiguous(),
        metadata.seq_lens,
        num_heads,
        num_kv_heads,
        scale,
        sliding_window or 0,
        q_norm,
        k_norm,
        norm_eps,
    )
