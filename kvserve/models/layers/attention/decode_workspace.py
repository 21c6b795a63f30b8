"""Contiguous copies of the decoding sequences' KV, kept from one decode step to the next (CPU).

The paged pool scatters a sequence's KV over blocks, so attending over it in plain torch means
gathering every block of every decoding sequence, in every layer, at every step: at 16 streams
that copy moves about twice the KV bytes that SDPA then reads again. A decoding sequence's KV
only grows by one token per step, so each layer keeps a contiguous copy, one row per sequence
([2, rows, num_kv_heads, capacity, head_dim]): a row is filled from the pool once, when its
sequence starts decoding, then extended by the new token each step, and SDPA reads it in place.

`plan()` runs once per forward and decides which rows continue and which are (re)filled; each
attention layer then calls `update()`. A sequence keeps its row only while it decodes in
consecutive forwards with its length growing by one; anything else (it was prefilling, was
preempted, or is new) refills its row from the pool, which is always correct. A layer whose
buffer would take the workspace over `max_bytes` gets None and attends over the pool instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvserve.models.layers.attention.kv_dtype import as_stored

# Rows and keys grow in these steps, so a buffer is reallocated rarely (its copy costs one gather).
_ROW_STEP = 8
_KEY_STEP = 256


@dataclass(frozen=True)
class RowPlan:
    """Where this forward's decodes live in the workspace."""

    rows: torch.Tensor  # [num_decodes] int64: the row of each decode
    positions: torch.Tensor  # [num_decodes] int64: the position of each decode's new token
    is_identity: bool  # rows == arange(num_decodes): no scatter of queries / gather of outputs
    fresh: tuple[int, ...]  # decode indices whose rows are filled from the pool
    num_rows: int  # rows attention covers: the highest used row + 1
    row_lens: tuple[int, ...]  # [num_rows] KV length of each row (0: unused row)


class DecodeWorkspace:
    """Per-layer contiguous decode KV; one instance per attention backend (so per model)."""

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes = max_bytes
        self._rows: dict[str, tuple[int, int]] = {}  # seq id -> (row, KV length) after the last forward
        self._buffers: dict[int, torch.Tensor] = {}  # cache data_ptr -> [2, rows, kvh, capacity, d]
        self._seen: set[int] = set()  # caches updated since the last plan
        self._need_rows = 0
        self._need_keys = 0

    def forget(self) -> None:
        """A forward without workspace decodes: no row continues into the next one."""
        self._rows = {}

    def plan(self, seq_ids: list[str], seq_lens: list[int]) -> RowPlan:
        """Assign rows to this forward's decodes (`seq_lens` count the new token); must be called
        (or `forget`) once per forward, so that only consecutive decodes keep their rows."""
        previous, self._rows = self._rows, {}
        self._drop_unused_buffers()
        taken: dict[int, int] = {}  # row -> decode index
        fresh: list[int] = []
        for i, (seq_id, seq_len) in enumerate(zip(seq_ids, seq_lens, strict=True)):
            row, length = previous.get(seq_id, (-1, -1))
            if length == seq_len - 1:
                taken[row] = i
            else:
                fresh.append(i)
        free = (r for r in range(len(seq_ids)) if r not in taken)  # lowest free rows first
        rows = [0] * len(seq_ids)
        for row, i in taken.items():
            rows[i] = row
        for i in fresh:
            rows[i] = next(free)
        num_rows = max(rows) + 1
        row_lens = [0] * num_rows
        for i, row in enumerate(rows):
            row_lens[row] = seq_lens[i]
            self._rows[seq_ids[i]] = (row, seq_lens[i])
        self._need_rows = _round_up(num_rows, _ROW_STEP)
        self._need_keys = _round_up(max(seq_lens), _KEY_STEP)
        return RowPlan(
            rows=torch.tensor(rows, dtype=torch.int64),
            positions=torch.tensor(seq_lens, dtype=torch.int64) - 1,
            is_identity=rows == list(range(len(rows))),
            fresh=tuple(fresh),
            num_rows=num_rows,
            row_lens=tuple(row_lens),
        )

    def update(
        self,
        cache: torch.Tensor,
        plan: RowPlan,
        k_new: torch.Tensor,
        v_new: torch.Tensor,
        block_tables: torch.Tensor,
    ) -> torch.Tensor | None:
        """Bring this layer's rows up to date and return its buffer (None: over budget).

        cache: the layer's pool [2, num_blocks, block_size, kvh, d], this step's KV already written;
        k_new, v_new: [num_decodes, kvh, d], this step's decode keys/values; block_tables:
        [num_decodes, n] the decodes' blocks (for the rows filled from the pool).
        """
        buffer, is_new = self._buffer(cache, k_new.dtype)
        if buffer is None:
            return None
        # As stored: a continuing row must hold what a row refilled from the pool would.
        buffer[0, plan.rows, :, plan.positions] = as_stored(k_new, cache.dtype).to(buffer.dtype)
        buffer[1, plan.rows, :, plan.positions] = as_stored(v_new, cache.dtype).to(buffer.dtype)
        fresh = range(len(plan.positions)) if is_new else plan.fresh  # a new buffer holds nothing yet
        if fresh:
            self._fill(buffer, cache, plan, list(fresh), block_tables)
        return buffer

    def _fill(
        self,
        buffer: torch.Tensor,
        cache: torch.Tensor,
        plan: RowPlan,
        fresh: list[int],
        block_tables: torch.Tensor,
    ) -> None:
        """Copy the `fresh` decodes' KV (including this step's token) from the pool into their rows."""
        block_size, num_kv_heads, head_dim = cache.shape[2:]
        num_keys = max(plan.row_lens[plan.rows[i]] for i in fresh)
        index = torch.tensor(fresh, dtype=torch.int64)
        tables = block_tables[index, : -(-num_keys // block_size)]  # [num_fresh, n]
        kv = cache.index_select(1, tables.reshape(-1))  # [2, num_fresh * n, block_size, kvh, d]
        kv = kv.view(2, len(fresh), -1, num_kv_heads, head_dim).transpose(2, 3)  # [2, F, kvh, n * bs, d]
        buffer[:, plan.rows[index], :, :num_keys] = kv[..., :num_keys, :].to(buffer.dtype)

    def _buffer(self, cache: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor | None, bool]:
        """(this layer's buffer, whether it was just created), grown to the plan's size; in the
        compute `dtype`, which an fp16 cache under fp32 compute is widened to once per key."""
        key = cache.data_ptr()
        self._seen.add(key)
        buffer = self._buffers.get(key)
        if buffer is not None and buffer.shape[1] >= self._need_rows and buffer.shape[3] >= self._need_keys:
            return buffer, False
        num_kv_heads, head_dim = cache.shape[-2:]
        shape = (2, self._need_rows, num_kv_heads, self._need_keys, head_dim)
        others = sum(b.numel() * b.element_size() for k, b in self._buffers.items() if k != key)
        element_size = torch.empty((), dtype=dtype).element_size()
        if others + torch.Size(shape).numel() * element_size > self.max_bytes:
            self._buffers.pop(key, None)
            return None, False
        # Zeros, not empty: masked keys are still read, and 0 * NaN would poison the output.
        grown = torch.zeros(shape, dtype=dtype, device=cache.device)
        if buffer is not None:  # continuing rows keep their KV
            rows, keys = min(buffer.shape[1], shape[1]), min(buffer.shape[3], shape[3])
            grown[:, :rows, :, :keys] = buffer[:, :rows, :, :keys]
        self._buffers[key] = grown
        return grown, buffer is None

    def _drop_unused_buffers(self) -> None:
        """Buffers of caches the last forward did not touch belong to an old KV pool (or to layers
        that fell back to the pool): dropping them keeps memory bounded and their rows honest."""
        if self._seen:
            for key in [k for k in self._buffers if k not in self._seen]:
                del self._buffers[key]
        self._seen = set()


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step
