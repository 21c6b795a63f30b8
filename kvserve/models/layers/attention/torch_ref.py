"""Reference paged attention in plain torch: gather the blocks, then SDPA.

It is the correctness oracle on every device and the production path on CPU, so the
per-layer work is kept to a few large ops: one index_copy_ per K/V write, one gather
plus one SDPA for the whole decode group, one SDPA per prefill chunk. Shapes come from
the metadata's host lists, so nothing here forces a device sync.

On CPU, when the metadata names its sequences, the decode group reads a `DecodeWorkspace`
instead of gathering: contiguous per-sequence KV kept across steps and extended by one
token per step (the gather moved about twice the KV bytes SDPA reads).

The cache may hold fp16 under fp32 compute (the CPU default): every read widens it to the
queries' dtype, and a prefill without context attends over its own KV as stored (kv_dtype.py).

`prefill_dtype` (bf16 under an fp32 engine with --bf16-prefill, on CPUs with AVX512-BF16 or AMX)
runs the prompt rows' attention in that dtype, where torch's CPU flash kernel uses the bf16 dot
products; a forward that computes prompt tokens then attends every row as a prefill, one-token
prompt tails included, so a prompt's KV does not depend on how it was chunked. Grouped KV heads
are read as they are stored: the query heads of a group become extra query rows (no
repeat_interleave of the keys and values).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvserve.models.layers.attention.backend import LayerAttention
from kvserve.models.layers.attention.cpu_decode import CpuDecodeKernel
from kvserve.models.layers.attention.cpu_prefill import CpuPrefillKernel
from kvserve.models.layers.attention.decode_workspace import DecodeWorkspace, RowPlan
from kvserve.models.layers.attention.kv_dtype import as_stored, to_kv_dtype
from kvserve.models.layers.attention.metadata import AttentionMetadata


@dataclass(frozen=True)
class _DecodePlan:
    num_seqs: int
    block_tables: torch.Tensor  # [num_decodes, num_blocks] physical blocks covering the visible keys
    num_keys: int  # gathered keys per sequence (the longest sequence's visible span)
    mask: torch.Tensor | None  # [num_decodes, 1, 1, num_keys] bool; None when every key is visible


@dataclass(frozen=True)
class _PrefillPlan:
    query_start: int
    query_end: int
    block_ids: torch.Tensor | None  # [num_blocks]; None: no context yet, attend over this step's k/v
    num_keys: int
    mask: torch.Tensor | None  # [num_queries, num_keys] bool; None: plain causal (is_causal=True)
    # Set when planned for CpuPrefillKernel (no mask is built then): the sequence's blocks from
    # position 0, its cached length and the window.
    block_table: torch.Tensor | None = None
    context_len: int = 0
    window: int | None = None


@dataclass(frozen=True)
class _WorkspacePlan:
    rows: RowPlan
    key_start: int  # keys before it are outside every row's window
    num_keys: int  # keys [key_start, key_start + num_keys) are read
    mask: torch.Tensor  # [num_rows, 1, 1, num_keys] additive (0 / -inf), in the queries' dtype


@dataclass(frozen=True)
class _Plan:
    decode: _DecodePlan | None
    prefills: tuple[_PrefillPlan, ...]
    workspace: _WorkspacePlan | None = None
    all_prefill: bool = False  # every row attends as a prefill (prefill_dtype in a prompt forward)


class TorchRefBackend:
    name = "torch_ref"

    def __init__(self, prefill_dtype: torch.dtype | None = None) -> None:
        self.prefill_dtype = prefill_dtype
        # The C++ prompt attention per compute dtype (None: SDPA), looked up at first use.
        self._prefill_kernels: dict[torch.dtype, CpuPrefillKernel | None] = {}
        # Memo of the last batch's plans, one per window size; layers of one forward share them.
        # NOTE: keyed on the metadata object's identity, so metadata must not be mutated in place.
        self._plan_metadata: AttentionMetadata | None = None
        self._plans: dict[int | None, _Plan] = {}
        self.workspace = DecodeWorkspace()
        self._rows: RowPlan | None = None  # this forward's workspace rows; None: gather from the pool
        self._folded_masks: dict[tuple[int, int, torch.dtype], torch.Tensor] = {}  # this forward's

    def decode_kernel(
        self, layer: LayerAttention, dtype: torch.dtype, cache: torch.Tensor
    ) -> CpuDecodeKernel | None:
        """fp32 CPU decodes in one C++ call per layer (cpu_decode.py); the layer's `attend` path
        covers every other step."""
        return CpuDecodeKernel(layer, cache) if CpuDecodeKernel.supports(dtype, cache) else None

    def write_kv(
        self, cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        num_kv_heads, head_dim = cache.shape[-2:]
        cache[0].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, to_kv_dtype(k, cache.dtype))
        cache[1].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, to_kv_dtype(v, cache.dtype))

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
        plan = self._plan(metadata, sliding_window, cache, q.dtype)
        if plan.all_prefill:
            outputs = [self._attend_prefill(q, k, v, cache, prefill, scale) for prefill in plan.prefills]
            return outputs[0] if len(outputs) == 1 else torch.cat(outputs)
        outputs: list[torch.Tensor] = []
        num_decodes = metadata.num_decodes
        buffer = None
        if plan.workspace is not None:
            tables = metadata.block_tables[:num_decodes]
            buffer = self.workspace.update(
                cache, plan.workspace.rows, k[:num_decodes], v[:num_decodes], tables
            )
        if buffer is not None:
            assert plan.workspace is not None
            outputs.append(_attend_workspace(q[:num_decodes], buffer, plan.workspace, scale))
        elif num_decodes:
            decode = plan.decode or _plan_decode(metadata, sliding_window)  # a layer over the budget
            outputs.append(_attend_decode(q[:num_decodes], cache, decode, scale))
        for prefill in plan.prefills:
            outputs.append(self._attend_prefill(q, k, v, cache, prefill, scale))
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)

    def _attend_prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cache: torch.Tensor,
        plan: _PrefillPlan,
        scale: float,
    ) -> torch.Tensor:
        dtype = self.prefill_dtype or q.dtype
        if plan.block_table is not None:  # planned for the C++ kernel
            kernel = self._prefill_kernel(dtype, cache)
            assert kernel is not None
            rows = q[plan.query_start : plan.query_end]
            return kernel(rows, cache, plan.block_table, plan.context_len, scale, plan.window)
        group = q.shape[1] // k.shape[1]
        mask = None
        if plan.mask is not None or group > 1:  # (a plan that reads cached blocks always has a mask)
            key = (id(plan), group, dtype)
            mask = self._folded_masks.get(key)
            if mask is None:
                mask = self._folded_masks[key] = _folded_mask(plan, group, dtype, q.device)
        return _attend_prefill(q, k, v, cache, plan, scale, dtype, mask)

    def _prefill_kernel(self, dtype: torch.dtype, cache: torch.Tensor) -> CpuPrefillKernel | None:
        if dtype not in self._prefill_kernels:
            self._prefill_kernels[dtype] = (
                CpuPrefillKernel.for_dtype(dtype) if cache.device.type == "cpu" else None
            )
        kernel = self._prefill_kernels[dtype]
        return kernel if kernel is not None and kernel.supports(cache) else None

    def _plan(
        self, metadata: AttentionMetadata, window: int | None, cache: torch.Tensor, dtype: torch.dtype
    ) -> _Plan:
        all_prefill = self.prefill_dtype is not None and metadata.computes_prompt
        if self._plan_metadata is not metadata:
            self._plan_metadata, self._plans, self._folded_masks = metadata, {}, {}
            if all_prefill:
                self.workspace.forget()  # as any forward without decode rows
                self._rows = None
            else:
                self._rows = self._plan_rows(metadata, cache)
        plan = self._plans.get(window)
        kernel = self._prefill_kernel(self.prefill_dtype or dtype, cache) is not None
        if plan is None and all_prefill:
            prefills = tuple(_plan_prefill(metadata, i, window, kernel) for i in range(metadata.num_seqs))
            plan = self._plans[window] = _Plan(None, prefills, all_prefill=True)
        if plan is None:
            workspace = None
            if self._rows is not None:
                workspace = _plan_workspace(self._rows, window, dtype)
            decode = None
            if metadata.num_decodes and workspace is None:
                decode = _plan_decode(metadata, window)
            prefill_ids = range(metadata.num_decodes, metadata.num_seqs)
            prefills = tuple(_plan_prefill(metadata, i, window, kernel) for i in prefill_ids)
            plan = self._plans[window] = _Plan(decode, prefills, workspace)
        return plan

    def _plan_rows(self, metadata: AttentionMetadata, cache: torch.Tensor) -> RowPlan | None:
        """Once per forward: the workspace rows of the decode group (CPU, named sequences only)."""
        num_decodes = metadata.num_decodes
        if metadata.seq_ids is None or not num_decodes or cache.device.type != "cpu":
            self.workspace.forget()
            return None
        return self.workspace.plan(metadata.seq_ids[:num_decodes], metadata.seq_lens_cpu[:num_decodes])


def _first_visible_block(first_query_pos: int, block_size: int, window: int | None) -> int:
    """Blocks wholly before the window of the earliest query are skipped by the gather."""
    if window is None:
        return 0
    return max(0, first_query_pos - window + 1) // block_size


def _plan_decode(metadata: AttentionMetadata, window: int | None) -> _DecodePlan:
    num_decodes, block_size = metadata.num_decodes, metadata.block_size
    seq_lens = metadata.seq_lens_cpu[:num_decodes]
    first_block = min(_first_visible_block(n - 1, block_size, window) for n in seq_lens)
    key_start = first_block * block_size
    max_len = max(seq_lens)
    end_block = -(-max_len // block_size)
    num_keys = max_len - key_start
    block_tables = metadata.block_tables[:num_decodes, first_block:end_block]
    # A mask is needed only if some sequence is shorter than the longest, or the window cuts in.
    is_ragged = any(n != max_len for n in seq_lens)
    is_windowed = window is not None and any(key_start < n - window for n in seq_lens)
    mask = None
    if is_ragged or is_windowed:
        key_pos = torch.arange(key_start, max_len, device=metadata.seq_lens.device)  # [num_keys]
        lens = metadata.seq_lens[:num_decodes, None]  # [num_decodes, 1]
        visible = key_pos < lens
        if window is not None:
            visible &= key_pos >= lens - window
        mask = visible[:, None, None, :]
    return _DecodePlan(num_decodes, block_tables, num_keys, mask)


def _plan_workspace(rows: RowPlan, window: int | None, dtype: torch.dtype) -> _WorkspacePlan:
    lens = torch.tensor(rows.row_lens, dtype=torch.int64)[:, None]  # [num_rows, 1]
    used = [n for n in rows.row_lens if n]
    key_start = 0 if window is None else max(0, min(used) - window)
    key_pos = torch.arange(key_start, max(used))[None, :]  # [1, num_keys]
    visible = key_pos < lens
    if window is not None:
        visible &= key_pos >= lens - window
    visible[lens[:, 0] == 0, 0] = True  # unused rows: one (ignored) key, so no row is all -inf
    mask = torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, float("-inf"))
    return _WorkspacePlan(rows, key_start, visible.shape[1], mask[:, None, None, :])


def _plan_prefill(
    metadata: AttentionMetadata, seq_idx: int, window: int | None, for_kernel: bool = False
) -> _PrefillPlan:
    """`for_kernel`: for CpuPrefillKernel, which masks by position and reads the blocks itself, so
    neither the mask nor the gathered block ids are made."""
    query_start, query_end = metadata.query_start_loc_cpu[seq_idx : seq_idx + 2]
    context_len, seq_len = metadata.context_lens_cpu[seq_idx], metadata.seq_lens_cpu[seq_idx]
    block_size = metadata.block_size
    if for_kernel:
        table = metadata.block_tables[seq_idx, : -(-seq_len // block_size)]
        return _PrefillPlan(query_start, query_end, None, seq_len, None, table, context_len, window)
    if context_len == 0 and (window is None or window >= seq_len):
        return _PrefillPlan(query_start, query_end, None, seq_len, None)
    first_block = _first_visible_block(context_len, block_size, window)
    key_start = first_block * block_size
    block_ids = None
    if context_len > 0:
        block_ids = metadata.block_tables[seq_idx, first_block : -(-seq_len // block_size)]
    device = metadata.block_tables.device
    query_pos = torch.arange(context_len, seq_len, device=device)[:, None]  # [num_queries, 1]
    key_pos = torch.arange(key_start, seq_len, device=device)[None, :]  # [1, num_keys]
    visible = key_pos <= query_pos
    if window is not None:
        visible &= key_pos > query_pos - window
    return _PrefillPlan(query_start, query_end, block_ids, seq_len - key_start, visible)


def _attend_decode(q: torch.Tensor, cache: torch.Tensor, plan: _DecodePlan, scale: float) -> torch.Tensor:
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = cache.shape[-2]
    # index_select on flat block ids is several times faster on CPU than advanced indexing.
    kv = cache.index_select(1, plan.block_tables.reshape(-1))  # [2, num_seqs * num_blocks, block_size, ...]
    kv = kv.view(2, num_seqs, -1, num_kv_heads, head_dim)[:, :, : plan.num_keys]  # [2, B, num_keys, kvh, d]
    kv = kv.transpose(2, 3).to(q.dtype)  # [2, num_seqs, num_kv_heads, num_keys, head_dim]
    # GQA without copying KV: the query heads sharing a KV head become rows of one query block.
    q = q.view(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=plan.mask, scale=scale)
    return out.reshape(num_seqs, num_heads, head_dim)


def _attend_workspace(
    q: torch.Tensor, buffer: torch.Tensor, plan: _WorkspacePlan, scale: float
) -> torch.Tensor:
    """q: [num_decodes, num_heads, head_dim]; buffer: [2, rows, kvh, capacity, head_dim]."""
    num_decodes, num_heads, head_dim = q.shape
    rows, num_kv_heads, dtype = plan.rows, buffer.shape[2], q.dtype
    # GQA without copying KV: the query heads sharing a KV head become rows of one query block.
    q = q.view(num_decodes, num_kv_heads, num_heads // num_kv_heads, head_dim).to(buffer.dtype)
    if not rows.is_identity:  # decodes sit in scattered rows: queries go to theirs
        q = q.new_zeros(rows.num_rows, *q.shape[1:]).index_copy_(0, rows.rows, q)
    keys = slice(plan.key_start, plan.key_start + plan.num_keys)
    k, v = buffer[0, : rows.num_rows, :, keys], buffer[1, : rows.num_rows, :, keys]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=plan.mask, scale=scale)
    if not rows.is_identity:
        out = out.index_select(0, rows.rows)
    return out.reshape(num_decodes, num_heads, head_dim).to(dtype)


def _folded_mask(plan: _PrefillPlan, group: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[group * num_queries, num_keys] additive mask (0 / -inf) in `dtype` for the folded queries
    (row g * num_queries + i is query i of group member g); built once per forward and shared by
    every layer, so SDPA converts no boolean mask per call."""
    visible = plan.mask
    if visible is None:  # a fresh prompt without a window: plain causal over its own keys
        n = plan.query_end - plan.query_start
        visible = torch.ones(n, n, dtype=torch.bool, device=device).tril_()
    additive = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(~visible, float("-inf"))
    return additive.repeat(group, 1) if group > 1 else additive


def _attend_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: torch.Tensor,
    plan: _PrefillPlan,
    scale: float,
    dtype: torch.dtype,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """One sequence's prompt rows in `dtype`; `mask` (from `_folded_mask`) is None only for a fresh,
    unwindowed prompt without grouped heads (plain causal)."""
    num_queries = plan.query_end - plan.query_start
    if plan.block_ids is None:
        k_seq = as_stored(k[plan.query_start : plan.query_end], cache.dtype).transpose(0, 1)  # [kvh, keys, d]
        v_seq = as_stored(v[plan.query_start : plan.query_end], cache.dtype).transpose(0, 1)
    else:
        kv = cache.index_select(1, plan.block_ids).flatten(1, 2)[:, : plan.num_keys]  # [2, num_keys, kvh, d]
        kv = kv.transpose(1, 2)  # [2, num_kv_heads, num_keys, head_dim]
        k_seq, v_seq = kv[0], kv[1]
    k_seq, v_seq = k_seq.to(dtype), v_seq.to(dtype)
    num_heads, head_dim = q.shape[1:]
    num_kv_heads = k_seq.shape[0]
    group = num_heads // num_kv_heads
    # Grouped heads without copying KV: the `group` query heads of a KV head become group * num_queries
    # query rows of that head, under the mask repeated per member (CPU SDPA's enable_gqa falls back to
    # the math kernel, which materializes [heads, queries, keys] scores).
    q_seq = q[plan.query_start : plan.query_end].to(dtype)  # [num_queries, num_heads, head_dim]
    q_seq = q_seq.view(num_queries, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
    q_seq = q_seq.reshape(num_kv_heads, group * num_queries, head_dim)
    # 4-D inputs: CPU SDPA only takes its flash kernel for [batch, heads, len, dim].
    out = F.scaled_dot_product_attention(
        q_seq[None], k_seq[None], v_seq[None], attn_mask=mask, is_causal=mask is None, scale=scale
    )[0]  # [num_kv_heads, group * num_queries, head_dim]
    out = out.view(num_kv_heads, group, num_queries, head_dim).permute(2, 0, 1, 3)
    return out.reshape(num_queries, num_heads, head_dim).to(q.dtype)
