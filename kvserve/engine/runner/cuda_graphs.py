"""CUDA graphs for decode steps, one per padded batch size, captured at start-up.

A decode step at batch size B replays the graph of the smallest captured size >= B: the
step's ids, positions, slots, lengths and block tables are copied from pinned host buffers
into the static device buffers the graph reads (one async copy for a few streams, three for
many), then one replay runs the whole forward plus the logits and their argmax. Padded rows get
slot -1 (the Triton `write_kv` skips it) and length 1, so they write nothing and read one
harmless key. The graph's grid never depends on
sequence lengths (see triton_decode.py), so one capture serves every context length.

Overlapped decode (engine/overlap.py) launches step n + 1 before the host has read step n's ids, so
the pinned staging buffers are double-buffered: the host fills one set while the copy out of the
other may still be queued behind the running step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from kvserve.engine.outputs import ScheduledRequest
from kvserve.engine.runner.decode_staging import IDS, POSITIONS, SEQ_LENS, SLOTS, StagedRows, pad_rows
from kvserve.engine.sampler import logits_and_greedy
from kvserve.models.layers.attention.backend import CapturesDecode
from kvserve.models.layers.attention.metadata import AttentionMetadata, forward_context
from kvserve.models.layers.attention.triton_decode import choose_num_splits

logger = logging.getLogger(__name__)

GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_FULL_ROWS_BYTES = 128 * 1024  # up to this, a step uploads whole block-table rows (see run())


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # [batch_size, vocab] float32, the graph's output buffer
    greedy_ids: torch.Tensor  # [batch_size] int64: the logits' argmax, also computed in the graph


def _upload_layout(max_batch_size: int, max_blocks_per_seq: int, *, device=None, pin_memory=False):
    """One byte buffer holding the packed per-token rows [4, B] int64, then the block tables [B, M]
    int32, with views of both: a small batch uploads its inputs in one contiguous copy."""
    packed_bytes = 4 * max_batch_size * 8
    buffer = torch.zeros(
        packed_bytes + max_batch_size * max_blocks_per_seq * 4,
        dtype=torch.uint8,
        device=device,
        pin_memory=pin_memory,
    )
    packed = buffer[:packed_bytes].view(torch.int64).view(4, max_batch_size)
    tables = buffer[packed_bytes:].view(torch.int32).view(max_batch_size, max_blocks_per_seq)
    return buffer, packed, tables


class _Staging:
    """The pinned host side of the upload buffer, which one step fills."""

    def __init__(self, max_batch_size: int, max_blocks_per_seq: int) -> None:
        self.buffer, self.packed, self.tables = _upload_layout(
            max_batch_size, max_blocks_per_seq, pin_memory=True
        )
        self.rows = StagedRows(self.packed.numpy(), self.tables.numpy())


class DecodeGraphs:
    def __init__(
        self,
        model: torch.nn.Module,
        backend: CapturesDecode,
        *,
        max_batch_size: int,
        max_blocks_per_seq: int,
        block_size: int,
        device: torch.device,
        memory_budget_bytes: int,
    ) -> None:
        self.model, self.backend, self.block_size = model, backend, block_size
        self.sizes = tuple(b for b in GRAPH_BATCH_SIZES if b <= max_batch_size)
        max_bs = self.sizes[-1]
        # Packed int64 rows of ids/positions/slots/lengths, then the block tables (see run()).
        self._staging = [_Staging(max_bs, max_blocks_per_seq) for _ in range(2)]
        self._flip = 0  # which staging set the next step fills
        self._upload, self._packed, self._tables = _upload_layout(max_bs, max_blocks_per_seq, device=device)
        self._packed_bytes = self._packed.numel() * 8
        self._max_blocks = max_blocks_per_seq
        self._tables_staging = torch.zeros(max_bs * max_blocks_per_seq, dtype=torch.int32, device=device)
        self._graphs: dict[int, _Graph] = {}
        self.num_replays = 0  # for tests and logs
        self._capture_all(memory_budget_bytes)

    @property
    def max_batch_size(self) -> int:
        return max(self._graphs, default=0)

    def can_run(self, scheduled: list[ScheduledRequest]) -> bool:
        return len(scheduled) <= self.max_batch_size and all(s.num_new_tokens == 1 for s in scheduled)

    def run(
        self, scheduled: list[ScheduledRequest], input_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [len(scheduled), vocab] and their argmax [len(scheduled)] (views of the graph's
        outputs, valid until the next run): an all-greedy step needs no kernel outside the graph.
        `input_ids` (device, [len(scheduled)]): the step's input tokens when the host does not know
        them yet (the previous step's argmax, still being computed); else they are read from the
        requests."""
        num_seqs = len(scheduled)
        size = next(b for b in self.sizes if b >= num_seqs and b in self._graphs)
        staging = self._staging[self._flip]
        self._flip ^= 1
        # Full table rows when they are few: packed rows and tables then go up in one copy. Else a
        # compact [num_seqs, width] staging (a 256-stream step would upload 8 MB of full rows),
        # scattered into the rows on the device.
        full_rows = num_seqs * self._max_blocks * 4 <= _FULL_ROWS_BYTES
        width = staging.rows.fill(scheduled, self.block_size, full_rows=full_rows, with_ids=input_ids is None)
        pad_rows(staging.rows.packed, num_seqs, size)
        if full_rows:
            # Up to the last row's last block in use (a 128K context has 32 KB rows).
            num_bytes = self._packed_bytes + ((num_seqs - 1) * self._max_blocks + width) * 4
            self._upload[:num_bytes].copy_(staging.buffer[:num_bytes], non_blocking=True)
        else:
            self._packed.copy_(staging.packed, non_blocking=True)
            staged = self._tables_staging[: num_seqs * width]
            staged.copy_(staging.tables.view(-1)[: num_seqs * width], non_blocking=True)
            self._tables[:num_seqs, :width].copy_(staged.view(num_seqs, width))
        if input_ids is not None:  # stream-ordered after the step that computes them
            self._packed[IDS, :num_seqs].copy_(input_ids)
        graph = self._graphs[size]
        graph.graph.replay()
        self.num_replays += 1
        return graph.logits[:num_seqs], graph.greedy_ids[:num_seqs]

    def _capture_all(self, budget: int) -> None:
        # The graphs' private pool is part of the caching allocator's reserved memory. torch.cuda.graph
        # empties the allocator's cache on entry, so measure from an emptied cache: otherwise freed
        # warm-up blocks count against the graphs (the H200 run logged "-674 MiB" for the 8B shape)
        # and the budget check below sees too little.
        torch.cuda.empty_cache()
        reserved_before = torch.cuda.memory_reserved()
        pool = torch.cuda.graph_pool_handle()
        # Largest first: the smaller graphs reuse its activations in the shared pool.
        for size in reversed(self.sizes):
            staging = self._staging[0]
            pad_rows(staging.rows.packed, 0, size)
            self._packed.copy_(staging.packed)
            self._graphs[size] = self._capture(size, pool)
            used = torch.cuda.memory_reserved() - reserved_before
            if used > budget:
                logger.warning("CUDA graphs stopped at batch %d: %.0f MiB used", size, used / 2**20)
                break
        captured = sorted(self._graphs)
        used_mib = (torch.cuda.memory_reserved() - reserved_before) / 2**20
        logger.info("CUDA graphs captured for decode batches %s (%.0f MiB)", captured, used_mib)

    def _capture(self, size: int, pool) -> _Graph:
        metadata = AttentionMetadata(
            block_size=self.block_size,
            num_decodes=size,
            slot_mapping=self._packed[SLOTS, :size],
            block_tables=self._tables[:size],
            seq_lens=self._packed[SEQ_LENS, :size],
            query_start_loc_cpu=list(range(size + 1)),
            seq_lens_cpu=[1] * size,  # unused: the split count below is fixed per graph
            context_lens_cpu=[0] * size,
        )
        num_kv_heads = self.model.kv_cache_spec()[1]
        self.backend.graph_num_splits = choose_num_splits(size, num_kv_heads, None, self.backend.num_sms)
        ids, positions = self._packed[IDS, :size], self._packed[POSITIONS, :size]
        try:
            with forward_context(metadata):
                for _ in range(2):  # compile the kernels and settle the allocator outside the capture
                    logits_and_greedy(self.model, self.model(ids, positions))
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    # The same logits as the sampler's compute_logits; the argmax its greedy path runs.
                    logits, greedy_ids = logits_and_greedy(self.model, self.model(ids, positions))
        finally:
            self.backend.graph_num_splits = None
        return _Graph(graph, logits, greedy_ids)
