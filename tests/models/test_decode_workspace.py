"""The torch backend's decode workspace: rows kept across steps must give the dense attention of
every step, whatever joins, leaves, reorders, pauses or outgrows the buffers."""

from __future__ import annotations

import random

import pytest
import torch

from kvserve.models.layers.attention.decode_workspace import DecodeWorkspace
from kvserve.models.layers.attention.metadata import AttentionMetadata
from kvserve.models.layers.attention.torch_ref import TorchRefBackend

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 6, 2, 16, 4, 512
MAX_LEN = 300


def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None) -> torch.Tensor:
    """One decode query [H, D] at position len(k) - 1 over k/v [len, KVH, D]."""
    group = NUM_HEADS // NUM_KV_HEADS
    k, v = k.repeat_interleave(group, 1).float(), v.repeat_interleave(group, 1).float()
    scores = torch.einsum("hd,khd->hk", q.float(), k) * HEAD_DIM**-0.5
    j = torch.arange(k.shape[0])
    if window is not None:
        scores = scores.masked_fill(~(k.shape[0] - 1 - j < window), float("-inf"))
    return torch.einsum("hk,khd->hd", scores.softmax(-1), v)


class _Pool:
    """Sequences with random KV in a shuffled block pool; a position reaches the pool only when a
    step writes it (slots past a sequence's length hold other random values)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.gen = torch.Generator().manual_seed(0)
        self.dtype = dtype
        self.cache = torch.randn(2, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, generator=self.gen).to(
            dtype
        )
        self.free = list(range(NUM_BLOCKS))
        random.Random(0).shuffle(self.free)
        self.seqs: dict[str, tuple[list[int], torch.Tensor, torch.Tensor]] = {}
        self.written: dict[str, int] = {}

    def _seq(self, seq_id: str) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        if seq_id not in self.seqs:
            blocks = [self.free.pop() for _ in range(-(-MAX_LEN // BLOCK_SIZE))]
            k, v = (
                torch.randn(MAX_LEN, NUM_KV_HEADS, HEAD_DIM, generator=self.gen).to(self.dtype) for _ in "kv"
            )
            self.seqs[seq_id], self.written[seq_id] = (blocks, k, v), 0
        return self.seqs[seq_id]

    def _slots(self, seq_id: str, start: int, end: int) -> torch.Tensor:
        blocks = self._seq(seq_id)[0]
        return torch.tensor(
            [blocks[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(start, end)]
        )

    def step(self, backend: TorchRefBackend, decodes: list[tuple[str, int]], window: int | None) -> None:
        """One forward of one-token decodes (seq id, length after the step), checked against dense."""
        ref = TorchRefBackend()
        for seq_id, seq_len in decodes:  # the context earlier steps (or a prefill) left in the pool
            _, k, v = self._seq(seq_id)
            start = self.written[seq_id]
            if start < seq_len - 1:
                ref.write_kv(
                    self.cache,
                    k[start : seq_len - 1],
                    v[start : seq_len - 1],
                    self._slots(seq_id, start, seq_len - 1),
                )
            self.written[seq_id] = seq_len
        lens = [n for _, n in decodes]
        tables = [self._seq(s)[0] for s, _ in decodes]
        metadata = AttentionMetadata(
            block_size=BLOCK_SIZE,
            num_decodes=len(decodes),
            slot_mapping=torch.cat([self._slots(s, n - 1, n) for s, n in decodes]),
            block_tables=torch.tensor(tables),
            seq_lens=torch.tensor(lens),
            query_start_loc_cpu=list(range(len(decodes) + 1)),
            seq_lens_cpu=lens,
            context_lens_cpu=[n - 1 for n in lens],
            seq_ids=[s for s, _ in decodes],
        )
        k_new = torch.stack([self._seq(s)[1][n - 1] for s, n in decodes])
        v_new = torch.stack([self._seq(s)[2][n - 1] for s, n in decodes])
        q = torch.randn(len(decodes), NUM_HEADS, HEAD_DIM, generator=self.gen).to(self.dtype)
        backend.write_kv(self.cache, k_new, v_new, metadata.slot_mapping)
        out = backend.attend(
            q, k_new, v_new, self.cache, metadata, scale=HEAD_DIM**-0.5, sliding_window=window
        )
        expected = torch.stack(
            [
                _dense(q[i], self._seq(s)[1][:n], self._seq(s)[2][:n], window)
                for i, (s, n) in enumerate(decodes)
            ]
        )
        tol = 1e-5 if self.dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)

    def prefill_only(self, backend: TorchRefBackend) -> None:
        """A forward without decodes (a fresh 3-token prefill of a new sequence)."""
        seq_id = f"prefill-{len(self.seqs)}"
        _, k, v = self._seq(seq_id)
        metadata = AttentionMetadata(
            block_size=BLOCK_SIZE,
            num_decodes=0,
            slot_mapping=self._slots(seq_id, 0, 3),
            block_tables=torch.tensor([self._seq(seq_id)[0]]),
            seq_lens=torch.tensor([3]),
            query_start_loc_cpu=[0, 3],
            seq_lens_cpu=[3],
            context_lens_cpu=[0],
            seq_ids=[seq_id],
        )
        q = torch.randn(3, NUM_HEADS, HEAD_DIM, generator=self.gen).to(self.dtype)
        backend.write_kv(self.cache, k[:3], v[:3], metadata.slot_mapping)
        backend.attend(q, k[:3], v[:3], self.cache, metadata, scale=HEAD_DIM**-0.5)


STEPS: list[list[tuple[str, int]] | None] = [  # None: a forward without decodes
    [("a", 10), ("b", 20)],  # both rows filled from the pool
    [("a", 11), ("b", 21)],  # both continue
    [("b", 22), ("c", 5), ("a", 12)],  # reordered, one joins
    [("c", 6), ("a", 13)],  # b leaves: a and c keep their rows, row 1 is a hole
    [("a", 14), ("d", 40), ("c", 7)],  # d takes the lowest free row
    None,  # a pause: nobody continues into the next forward
    [("a", 15), ("d", 41)],  # both refilled
    [("a", 17), ("d", 42)],  # a skipped a length: refilled
    [("e", 255), ("a", 18)],
    [("e", 256), ("a", 19)],
    [("e", 257), ("a", 20)],  # e outgrows the first 256-key buffer: it grows, rows kept
]


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_steps_match_dense(window: int | None, dtype: torch.dtype) -> None:
    pool, backend = _Pool(dtype), TorchRefBackend()
    for decodes in STEPS:
        if decodes is None:
            pool.prefill_only(backend)
        else:
            pool.step(backend, decodes, window)


def test_over_budget_layers_attend_over_the_pool() -> None:
    pool, backend = _Pool(torch.float32), TorchRefBackend()
    backend.workspace = DecodeWorkspace(max_bytes=1024)  # smaller than any buffer
    for decodes in STEPS:
        if decodes is not None:
            pool.step(backend, decodes, None)
    assert not backend.workspace._buffers


def test_rows_continue_only_for_consecutive_growth() -> None:
    ws = DecodeWorkspace()
    first = ws.plan(["a", "b", "c"], [5, 9, 3])
    assert first.rows.tolist() == [0, 1, 2] and first.fresh == (0, 1, 2) and first.is_identity
    second = ws.plan(["c", "a"], [4, 7])  # c continues in row 2; a skipped a token
    assert second.rows.tolist() == [2, 0] and second.fresh == (1,)
    assert second.row_lens == (7, 0, 4) and second.num_rows == 3 and not second.is_identity
    ws.forget()
    assert ws.plan(["c"], [5]).fresh == (0,)
