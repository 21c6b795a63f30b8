"""Prompt rows' attention on the CPU in one C++ call per sequence and layer
(csrc/prefill_attention.cpp): causal and sliding-window masks as position comparisons, key blocks
no row can see skipped, the paged KV read straight from the cache's blocks (no gather, no mask
tensor, no repeat of grouped KV heads).

fp32 runs everywhere the kernels build (oneDNN's fp32 micro-kernels). bf16 runs where the CPU has
AMX tiles or AVX512-BF16 (oneDNN's bf16 micro-kernels take B in the VNNI pair layout on both): on a
2-core AVX512-BF16 EPYC without AMX it was 2.4-3.5x torch's SDPA at 2,048-row chunks. (An earlier
measurement had it twice as slow as SDPA there, but on an AMX Xeon with AMX turned off through
ONEDNN_MAX_CPU_ISA, not on a CPU of that kind.) A prompt's KV still does not depend on how it was
chunked: the kernel takes keys in blocks aligned to absolute positions.
"""

from __future__ import annotations

from typing import Any

import torch

from kvserve.env import switches
from kvserve.models.layers import cpu_ext

# (query rows per GEMM, keys per block). The block size is part of the arithmetic (a row's sums go
# block by block), so it is fixed per dtype; the tile is not. Picked on a 2-core AVX2 EPYC (fp32)
# and a 2-core slice of an AMX Xeon (bf16), 512-row chunks over 0-12K keys (docs/benchmarks/history.md).
_TILES = {torch.float32: (64, 128), torch.bfloat16: (128, 256)}


class CpuPrefillKernel:
    """One sequence's prompt rows over its paged KV, for TorchRefBackend's prefill plans."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.query_tile, self.key_block = _TILES[dtype]
        self.vnni = dtype == torch.bfloat16  # bf16 B operands as [K/2, N, 2] (AMX and AVX512-BF16)
        self._ext: Any = cpu_ext.load()

    @staticmethod
    def for_dtype(dtype: torch.dtype) -> CpuPrefillKernel | None:
        """The kernel for prompt rows computed in `dtype` on this CPU, or None (torch's SDPA then)."""
        if not switches().is_cpu_prefill_attention_enabled or dtype not in _TILES:
            return None
        if dtype == torch.bfloat16 and not (cpu_ext.has_fast_bf16() and torch.backends.mkldnn.is_available()):
            return None
        return CpuPrefillKernel(dtype) if cpu_ext.load() is not None else None

    def supports(self, cache: torch.Tensor) -> bool:
        return (
            cache.device.type == "cpu"
            and cache.dtype in (torch.float16, torch.bfloat16, torch.float32)
            and cache.is_contiguous()
            and cache.shape[-1] % 8 == 0
        )

    def __call__(
        self,
        q: torch.Tensor,
        cache: torch.Tensor,
        block_table: torch.Tensor,
        context_len: int,
        scale: float,
        window: int | None,
    ) -> torch.Tensor:
        """q: [num_queries, num_heads, head_dim], the rows at positions context_len... (their KV
        already written); block_table: the sequence's blocks from position 0. Returns q's shape and
        dtype."""
        num_queries, num_heads, head_dim = q.shape
        num_kv_heads = cache.shape[-2]
        group = num_heads // num_kv_heads
        # [kv_heads, group, rows, dim]: the query heads of a KV head read its keys once.
        q_grouped = q.view(num_queries, num_kv_heads, group, head_dim).permute(1, 2, 0, 3).to(self.dtype)
        out = self._ext.prefill_attention(
            q_grouped.contiguous(),
            cache,
            block_table,
            context_len,
            scale,
            window or 0,
            self.vnni,
            self.query_tile,
            self.key_block,
        )  # [kv_heads, group, rows, dim] fp32
        return out.permute(2, 0, 1, 3).reshape(num_queries, num_heads, head_dim).to(q.dtype)
