"""K and V as the paged cache stores them.

The cache may hold fp16 under fp32 compute (the CPU default, config.CacheConfig.kv_dtype). Every
attention path then reads the rounded KV, the step's own new tokens included (a prefill attends
over its keys as stored, as llama.cpp's does), so a prompt's KV and answer are the same whether
it was prefilled in one chunk, in several, or found partly in the prefix cache.
"""

from __future__ import annotations

import torch

FP16_MAX = 65504.0


def to_kv_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`x` in the cache's dtype; fp16 saturates at its range rather than storing inf (as
    csrc/decode_attention.cpp's write does)."""
    if x.dtype == dtype:
        return x
    if dtype == torch.float16 and x.dtype == torch.float32:
        x = x.clamp(-FP16_MAX, FP16_MAX)
    return x.to(dtype)


def as_stored(x: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """`x` rounded through the cache's dtype and back: what a read of the cache gives."""
    return x if x.dtype == cache_dtype else to_kv_dtype(x, cache_dtype).to(x.dtype)
