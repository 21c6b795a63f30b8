"""The host side of a CUDA-graph decode step's inputs: one pinned buffer per step, filled from the
scheduled requests and uploaded in one or a few copies (cuda_graphs.py).

Filling it is per-request Python, paid every decode step for every running sequence (256 of them
on a GPU), while the engine's own step takes ~2 ms. Two things keep it small:
- the packed rows (ids, positions, slots, lengths) are gathered as Python lists and written with
  one numpy assignment, not four element writes per row;
- a block-table row is rewritten only when it changed since this buffer was last filled: a
  decoding request's table gains a block once every `block_size` steps, so most steps rewrite
  none. Each row remembers the request's block-id list (the KV manager's live list, which only
  grows while the request holds its blocks, and is replaced if it is freed and admitted again)
  and how many of its ids the row holds.

Only numpy and the request objects: tested on CPU, used on CUDA.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from kvserve.engine.outputs import ScheduledRequest

IDS, POSITIONS, SLOTS, SEQ_LENS = range(4)  # rows of the packed per-token buffer


def token_at(scheduled: ScheduledRequest, position: int) -> int:
    """The token at `position` without building prompt + output (all_token_ids copies both)."""
    prompt = scheduled.request.prompt_token_ids
    if position < len(prompt):
        return prompt[position]
    return scheduled.request.output_token_ids[position - len(prompt)]


class StagedRows:
    """One staging buffer's packed rows [4, B] int64 and block tables (B rows of at most M
    int32 ids, laid out either as full rows [B, M] or compact [num_seqs, width]), plus what each
    table row holds."""

    def __init__(self, packed: np.ndarray, tables: np.ndarray) -> None:
        self.packed = packed  # [4, B] int64
        self.tables = tables  # [B, M] int32; its memory also holds the compact layout
        self._layout: tuple[bool, int] | None = None  # (full rows, width) of the last fill
        self._lists: list[list[int] | None] = [None] * tables.shape[0]
        self._counts: list[int] = [0] * tables.shape[0]

    def fill(
        self, scheduled: list[ScheduledRequest], block_size: int, *, full_rows: bool, with_ids: bool
    ) -> int:
        """Write one-token decode rows for `scheduled` (padding up to the buffer is the caller's);
        returns the width: the most blocks any row needs. With `full_rows` the tables are [B, M]
        rows, else the buffer's first num_seqs * width ids, [num_seqs, width]."""
        num_seqs = len(scheduled)
        positions = [s.request.num_computed_tokens for s in scheduled]
        width = max(positions) // block_size + 1
        if full_rows:
            tables = self.tables
            layout = (True, 0)
        else:
            tables = self.tables.reshape(-1)[: num_seqs * width].reshape(num_seqs, width)
            layout = (False, width)
        lists, counts = self._lists, self._counts
        if layout != self._layout:  # the rows moved in memory: nothing written before is in place
            self._layout = layout
            lists[:] = [None] * len(lists)
        slots = []
        for row, s in enumerate(scheduled):
            position = positions[row]
            block_ids = s.block_ids
            num_blocks = position // block_size + 1
            slots.append(block_ids[num_blocks - 1] * block_size + position % block_size)
            if lists[row] is not block_ids or counts[row] != num_blocks:
                tables[row, :num_blocks] = (
                    block_ids if len(block_ids) == num_blocks else block_ids[:num_blocks]
                )
                lists[row] = block_ids
                counts[row] = num_blocks
        packed = self.packed
        if with_ids:
            packed[IDS, :num_seqs] = [token_at(s, p) for s, p in zip(scheduled, positions, strict=True)]
        # Rotary positions: the token index, shifted where the prompt held M-RoPE images, plus the
        # RoPE regime's offset (engine/rope_regime.py).
        packed[POSITIONS, :num_seqs] = [
            p + s.request.decode_shift for s, p in zip(scheduled, positions, strict=True)
        ]
        packed[SLOTS, :num_seqs] = slots
        packed[SEQ_LENS, :num_seqs] = [p + 1 for p in positions]
        return width


def pad_rows(packed: np.ndarray, start: int, end: int) -> None:
    """Padded rows write no KV (slot -1, skipped by the Triton KV write) and read one key."""
    packed[IDS, start:end] = 0
    packed[POSITIONS, start:end] = 0
    packed[SLOTS, start:end] = -1
    packed[SEQ_LENS, start:end] = 1
