"""The Triton paged-attention backend (CUDA; also runs under TRITON_INTERPRET=1 on CPU for tests).

Same contract as `TorchRefBackend`: `write_kv` stores this step's keys/values (one kernel for
K and V of every head; a negative slot is skipped, which is how padded CUDA-graph rows write
nothing), and `attend` runs the decode kernel over the leading one-token sequences and the
prefill kernel over the rest. The decode path reads only device tensors and the fixed batch
size, so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import functools
import itertools

import torch
import triton
import triton.language as tl

from kvserve.models.layers import fused_ops
from kvserve.models.layers.attention.backend import RotaryKVKernel
from kvserve.models.layers.attention.metadata import AttentionMetadata
from kvserve.models.layers.attention.triton_decode import (
    choose_num_splits,
    compile_split_variants,
    decode_attention,
)
from kvserve.models.layers.attention.triton_prefill import prefill_attention
from kvserve.models.layers.triton_launch import pdl_enter, use_pdl


@triton.jit
def _write_kv_kernel(
    k_ptr,
    v_ptr,
    cache_ptr,
    slot_ptr,
    v_offset,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)  # see triton_launch.py
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    is_written = (heads[:, None] * 0 + slot) >= 0  # [BLOCK_H, 1]: padded rows carry slot -1
    mask = (heads[:, None] < NUM_KV_HEADS) & (d[None, :] < HEAD_DIM) & is_written
    k = tl.load(k_ptr + token * stride_kt + heads[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(v_ptr + token * stride_vt + heads[:, None] * stride_vh + d[None, :], mask=mask)
    dst = slot * (NUM_KV_HEADS * HEAD_DIM) + heads[:, None] * HEAD_DIM + d[None, :]
    tl.store(cache_ptr + dst, k.to(cache_ptr.dtype.element_ty), mask=mask)
    tl.store(cache_ptr + v_offset + dst, v.to(cache_ptr.dtype.element_ty), mask=mask)


class _PrefillTensors:
    """Device copies of the prefill part's host lists, built once per batch (shared by layers)."""

    def __init__(self, metadata: AttentionMetadata) -> None:
        first = metadata.num_decodes
        starts = metadata.query_start_loc_cpu[first:]
        device = metadata.seq_lens.device
        self.query_start = torch.tensor(starts, dtype=torch.int32).to(device, non_blocking=True)
        context = metadata.context_lens_cpu[first:]
        self.context_lens = torch.tensor(context, dtype=torch.int32).to(device, non_blocking=True)
        self.block_tables = metadata.block_tables[first:]
        self.max_num_queries = max(b - a for a, b in itertools.pairwise(starts))


class TritonBackend:
    name = "triton"

    def __init__(self, num_sms: int | None = None) -> None:
        if num_sms is None:
            is_cuda = torch.cuda.is_available()
            num_sms = torch.cuda.get_device_properties(0).multi_processor_count if is_cuda else 8
        self.num_sms = num_sms
        # Set by the CUDA-graph runner while capturing: the split count must not depend on
        # host sequence lengths, which differ at every replay.
        self.graph_num_splits: int | None = None
        self._prefill_metadata: AttentionMetadata | None = None
        self._prefill: _PrefillTensors | None = None

    def write_kv(
        self, cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        num_tokens, num_kv_heads, head_dim = k.shape
        assert k.stride(-1) == 1 and v.stride(-1) == 1
        v_offset = cache[1].storage_offset() - cache.storage_offset()
        pdl = use_pdl(k)
        _write_kv_kernel[(num_tokens,)](
            k,
            v,
            cache,
            slot_mapping,
            v_offset,
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            NUM_KV_HEADS=num_kv_heads,
            HEAD_DIM=head_dim,
            BLOCK_H=triton.next_power_of_2(num_kv_heads),
            BLOCK_D=triton.next_power_of_2(head_dim),
            PDL=pdl,
            num_warps=1 if num_kv_heads * head_dim <= 1024 else 4,
            launch_pdl=pdl,
        )

    def rotary_kv_kernel(self, dtype: torch.dtype, cache: torch.Tensor) -> RotaryKVKernel | None:
        """RoPE of q and k and the KV write in one launch (fused_ops.rotary) instead of two, with the
        fused small ops on (fused_ops.ENABLED)."""
        if not (cache.is_cuda and fused_ops.ENABLED):
            return None
        return functools.partial(fused_ops.rotary, kv_cache=cache)

    def precompile(self, cache: torch.Tensor, num_heads: int, *, scale: float, window: int | None) -> None:
        """The decode kernel at every split count (triton_decode.compile_split_variants)."""
        compile_split_variants(cache, num_heads, scale=scale, window=window)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cache: torch.Tensor,
        metadata: AttentionMetadata,
        *,
        scale: float,
        sliding_window: int | None = None,
    ) -> torch.Tensor:
        out = torch.empty_like(q)
        num_decodes = metadata.num_decodes
        if num_decodes:
            num_splits = self.graph_num_splits
            if num_splits is None:
                max_len = max(metadata.seq_lens_cpu[:num_decodes])
                num_splits = choose_num_splits(num_decodes, cache.shape[-2], max_len, self.num_sms)
            decode_attention(
                q[:num_decodes],
                cache,
                metadata.block_tables[:num_decodes],
                metadata.seq_lens[:num_decodes],
                out[:num_decodes],
                scale=scale,
                window=sliding_window,
                num_splits=num_splits,
            )
        if metadata.num_seqs > num_decodes:
            prefill = self._prefill_tensors(metadata)
            prefill_attention(
                q,
                cache,
                prefill.block_tables,
                prefill.query_start,
                prefill.context_lens,
                out,
                max_num_queries=prefill.max_num_queries,
                scale=scale,
                window=sliding_window,
            )
        return out

    def _prefill_tensors(self, metadata: AttentionMetadata) -> _PrefillTensors:
        # NOTE: keyed on the metadata object's identity, like TorchRefBackend's plans.
        if self._prefill_metadata is not metadata or self._prefill is None:
            self._prefill_metadata, self._prefill = metadata, _PrefillTensors(metadata)
        return self._prefill
