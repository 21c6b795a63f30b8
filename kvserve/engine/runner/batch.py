"""Flattening a SchedulerOutput into the tensors one model forward needs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kvserve.engine.outputs import ScheduledRequest
from kvserve.models.layers.attention.metadata import AttentionMetadata


@dataclass
class ModelInputs:
    input_ids: torch.Tensor  # [num_tokens] int64
    # [num_tokens] int64 rotary positions (the token index, shifted after M-RoPE images); [3, num_tokens]
    # (t, h, w) when a chunk holds tokens of an image on an M-RoPE grid (engine/positions.py). A
    # trained-RoPE request's carry TRAINED_ROPE_OFFSET (engine/rope_regime.py).
    positions: torch.Tensor
    attn: AttentionMetadata
    logits_indices: torch.Tensor  # [num_sampling] rows of the hidden states to turn into logits
    sampling: list[ScheduledRequest]  # the requests that sample this step, in logits_indices order


def build_model_inputs(
    scheduled: list[ScheduledRequest], block_size: int, device: torch.device
) -> ModelInputs:
    """Decodes must come first (the scheduler's order); the attention backend relies on it.

    The per-token index arithmetic runs in numpy: a step that mixes 255 decodes with a 512-token
    prefill is ~770 tokens and 256 block-table rows, and on an engine host torch's own CPU ops on
    such small tensors cost more than the GPU's step (tens of µs each, and its intra-op threads)."""
    token_ids: list[int] = []
    query_start_loc = [0]
    seq_lens: list[int] = []
    context_lens: list[int] = []
    counts: list[int] = []
    logits_rows: list[int] = []
    sampling: list[ScheduledRequest] = []
    num_decodes = 0
    max_blocks = 0
    for s in scheduled:
        start, n = s.start, s.num_new_tokens
        token_ids.extend(_token_slice(s, start, n))
        context_lens.append(start)
        seq_lens.append(start + n)
        counts.append(n)
        query_start_loc.append(query_start_loc[-1] + n)
        if n == 1 and num_decodes == len(seq_lens) - 1:
            num_decodes += 1
        if s.samples:
            logits_rows.append(query_start_loc[-1] - 1)
            sampling.append(s)
        max_blocks = max(max_blocks, len(s.block_ids))

    block_tables = np.zeros((len(scheduled), max_blocks), dtype=np.int64)
    for row, s in enumerate(scheduled):
        block_tables[row, : len(s.block_ids)] = s.block_ids

    # Per-token sequence index and position, then one gather for the slot of every new token.
    seq_index = np.repeat(np.arange(len(scheduled)), counts)
    offsets = np.arange(len(token_ids), dtype=np.int64) - np.repeat(query_start_loc[:-1], counts)
    positions = np.repeat(np.asarray(context_lens, dtype=np.int64), counts) + offsets
    slot_mapping = block_tables[seq_index, positions // block_size] * block_size + positions % block_size
    rope_positions = _rope_positions(scheduled, positions, query_start_loc)
    if any(s.request.uses_trained_rope for s in scheduled):  # the regime rides in the positions
        offsets = np.repeat(np.asarray([s.request.rope_offset for s in scheduled], dtype=np.int64), counts)
        rope_positions = rope_positions + offsets  # broadcast over M-RoPE's three rows too

    attn = AttentionMetadata(
        block_size=block_size,
        num_decodes=num_decodes,
        slot_mapping=_to(torch.from_numpy(slot_mapping), device),
        block_tables=_to(torch.from_numpy(block_tables), device),
        seq_lens=_to(torch.tensor(seq_lens, dtype=torch.int64), device),
        query_start_loc_cpu=query_start_loc,
        seq_lens_cpu=seq_lens,
        context_lens_cpu=context_lens,
        seq_ids=[s.request.request_id for s in scheduled],
        computes_prompt=not all(s.is_decode for s in scheduled),
    )
    return ModelInputs(
        input_ids=_to(torch.tensor(token_ids, dtype=torch.int64), device),
        positions=_to(torch.from_numpy(rope_positions), device),
        attn=attn,
        logits_indices=_to(torch.tensor(logits_rows, dtype=torch.int64), device),
        sampling=sampling,
    )


def _rope_positions(
    scheduled: list[ScheduledRequest], index: np.ndarray, query_start_loc: list[int]
) -> np.ndarray:
    """The rotary positions of the flat batch whose token indices are `index`: the indices
    themselves unless a request lays images out on M-RoPE grids; [3, num_tokens] where a chunk holds
    such an image's tokens (every other token's three positions equal)."""
    spans = [
        (row, s.request.position_layout, s.start, s.start + s.num_new_tokens)
        for row, s in enumerate(scheduled)
        if s.request.position_layout is not None
    ]
    if not spans:
        return index
    if not any(layout.touches_grid(start, end) for _, layout, start, end in spans):
        shifted = index.copy()
        for row, layout, start, end in spans:
            shifted[query_start_loc[row] : query_start_loc[row + 1]] += layout.shifts(start, end)
        return shifted
    positions = np.broadcast_to(index, (3, len(index))).copy()
    for row, layout, start, end in spans:
        positions[:, query_start_loc[row] : query_start_loc[row + 1]] = layout.positions3(start, end)
    return positions


def _to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host -> device; through pinned memory on CUDA so the copy is async (no sync in the step)."""
    if device.type == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def _token_slice(scheduled: ScheduledRequest, start: int, n: int) -> list[int]:
    """Tokens [start, start + n) without copying prompt + output (all_token_ids does)."""
    prompt, output = scheduled.request.prompt_token_ids, scheduled.request.output_token_ids
    if start >= len(prompt):
        return output[start - len(prompt) : start - len(prompt) + n]
    if start + n <= len(prompt):
        return prompt[start : start + n]
    return prompt[start:] + output[: start + n - len(prompt)]
