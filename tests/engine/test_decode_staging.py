"""The CUDA-graph decode step's host staging (runner/decode_staging.py), checked on CPU against a
fresh fill of every row: rows it skips because they did not change must still hold the right ids."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kvserve.engine.outputs import ScheduledRequest
from kvserve.engine.request import Request
from kvserve.engine.runner.decode_staging import IDS, POSITIONS, SEQ_LENS, SLOTS, StagedRows, pad_rows
from kvserve.engine.sampling_params import SamplingParams

BLOCK = 4
MAX_BLOCKS = 16
ROWS = 8


class Seq:
    """A decoding request with a block table that grows like the KV manager's live list."""

    def __init__(self, name: str, prompt_len: int, rng: random.Random) -> None:
        self.rng = rng
        self.request = Request(name, [rng.randrange(1000) for _ in range(prompt_len)], SamplingParams())
        self.request.output_token_ids.append(rng.randrange(1000))
        self.request.num_computed_tokens = prompt_len  # the last sampled token is the next input
        self.block_ids: list[int] = []
        self.grow()

    def grow(self) -> None:
        while len(self.block_ids) * BLOCK <= self.request.num_computed_tokens:
            self.block_ids.append(self.rng.randrange(10_000))

    def step(self) -> None:
        self.request.num_computed_tokens += 1
        self.request.output_token_ids.append(self.rng.randrange(1000))
        self.grow()

    def readmit(self) -> None:
        """Preempted and admitted again: a new table (a new list), maybe as long as the old one."""
        self.block_ids = [self.rng.randrange(10_000) for _ in self.block_ids]

    def scheduled(self) -> ScheduledRequest:
        return ScheduledRequest(self.request, 1, self.block_ids)


def expected(seqs: list[Seq], full_rows: bool) -> tuple[np.ndarray, list[list[int]]]:
    packed = np.zeros((4, len(seqs)), np.int64)
    rows = []
    for row, seq in enumerate(seqs):
        r = seq.request
        p = r.num_computed_tokens
        packed[IDS, row] = (r.prompt_token_ids + r.output_token_ids)[p]
        packed[POSITIONS, row] = p
        packed[SLOTS, row] = seq.block_ids[p // BLOCK] * BLOCK + p % BLOCK
        packed[SEQ_LENS, row] = p + 1
        rows.append(seq.block_ids[: p // BLOCK + 1])
    return packed, rows


def check(staged: StagedRows, seqs: list[Seq], full_rows: bool, with_ids: bool) -> None:
    width = staged.fill([s.scheduled() for s in seqs], BLOCK, full_rows=full_rows, with_ids=with_ids)
    packed, rows = expected(seqs, full_rows)
    n = len(seqs)
    assert width == max(len(r) for r in rows)
    got = staged.packed[:, :n]
    first = IDS if with_ids else POSITIONS
    np.testing.assert_array_equal(got[first:], packed[first:])
    tables = staged.tables if full_rows else staged.tables.reshape(-1)[: n * width].reshape(n, width)
    for row, ids in enumerate(rows):
        assert tables[row, : len(ids)].tolist() == ids, f"row {row}"


@pytest.mark.parametrize("full_rows", [True, False])
@pytest.mark.parametrize("with_ids", [True, False])
def test_incremental_fill_matches_a_fresh_fill(full_rows: bool, with_ids: bool) -> None:
    rng = random.Random(0)
    staged = StagedRows(np.zeros((4, ROWS), np.int64), np.zeros((ROWS, MAX_BLOCKS), np.int32))
    seqs = [Seq(f"r{i}", rng.randrange(1, 20), rng) for i in range(6)]
    names = 6
    for step in range(60):
        check(staged, seqs, full_rows, with_ids)
        for seq in seqs:
            seq.step()
        event = step % 7
        if event == 2 and len(seqs) > 1:  # a request ends: the rows after it move up
            seqs.pop(rng.randrange(len(seqs)))
        elif event == 4 and len(seqs) < ROWS:  # a newcomer joins the decodes
            seqs.append(Seq(f"r{names}", rng.randrange(1, 30), rng))
            names += 1
        elif event == 5:
            rng.choice(seqs).readmit()
        if any(s.request.num_computed_tokens >= (MAX_BLOCKS - 1) * BLOCK for s in seqs):
            seqs = [s for s in seqs if s.request.num_computed_tokens < (MAX_BLOCKS - 1) * BLOCK]
            seqs.append(Seq(f"r{names}", 3, rng))
            names += 1


def test_a_skipped_row_is_one_whose_ids_are_already_there() -> None:
    """The second fill of an unchanged batch writes no table row (the point of the memo)."""
    rng = random.Random(1)
    staged = StagedRows(np.zeros((4, ROWS), np.int64), np.zeros((ROWS, MAX_BLOCKS), np.int32))
    seqs = [Seq(f"r{i}", 9, rng) for i in range(3)]
    scheduled = [s.scheduled() for s in seqs]
    staged.fill(scheduled, BLOCK, full_rows=True, with_ids=True)
    staged.tables[:] = -7  # anything written again would overwrite this
    staged.fill(scheduled, BLOCK, full_rows=True, with_ids=True)
    assert (staged.tables == -7).all()
    seqs[1].readmit()  # a new list, same length: that row and only that row is written
    staged.fill([s.scheduled() for s in seqs], BLOCK, full_rows=True, with_ids=True)
    assert (staged.tables[0] == -7).all() and (staged.tables[2] == -7).all()
    assert staged.tables[1, :3].tolist() == seqs[1].block_ids[:3]


def test_pad_rows_write_nothing_and_read_one_key() -> None:
    packed = np.full((4, 4), 9, np.int64)
    pad_rows(packed, 1, 4)
    assert packed[:, 1:].T.tolist() == [[0, 0, -1, 1]] * 3
    assert packed[:, 0].tolist() == [9, 9, 9, 9]


def test_a_decode_after_m_rope_images_takes_the_batch_builders_position() -> None:
    """The CUDA-graph staging and the eager batch (runner/batch.py) give a decode after an image on
    an M-RoPE grid the same rotary position: its index shifted by the image (2 x 3 tokens advance
    the position by 3)."""
    import torch

    from kvserve.engine.image_input import ImageInput
    from kvserve.engine.runner.batch import build_model_inputs

    image = ImageInput("a", 3, 6, torch.zeros(24, 8), grid=(1, 2, 3))
    request = Request("r", [1, 2, 3, *[9] * 6, 4, 5], SamplingParams(), images=(image,))
    request.output_token_ids.append(7)
    request.num_computed_tokens = 11
    scheduled = ScheduledRequest(request, 1, [0, 1, 2])
    staged = StagedRows(np.zeros((4, ROWS), np.int64), np.zeros((ROWS, MAX_BLOCKS), np.int32))
    staged.fill([scheduled], BLOCK, full_rows=True, with_ids=True)
    eager = build_model_inputs([scheduled], BLOCK, torch.device("cpu")).positions
    assert staged.packed[POSITIONS, 0] == eager.item() == 11 - 6 + 3
    assert staged.packed[SLOTS, 0] == 2 * BLOCK + 3  # the cache slot still follows the index


def test_the_staged_positions_are_the_eager_batchs_with_each_requests_rope_regime() -> None:
    """A CUDA-graph decode step carries each row's RoPE regime in its positions, as the eager
    batch does (engine/rope_regime.py): a trained-regime row gets TRAINED_ROPE_OFFSET."""
    import torch

    from kvserve.engine.runner.batch import build_model_inputs
    from kvserve.models.rope_scaling import TRAINED_ROPE_OFFSET

    rng = random.Random(7)
    seqs = [Seq(f"s{i}", 5 + 3 * i, rng) for i in range(3)]
    seqs[1].request.uses_trained_rope = True
    staged = StagedRows(np.zeros((4, ROWS), np.int64), np.zeros((ROWS, MAX_BLOCKS), np.int32))
    scheduled = [seq.scheduled() for seq in seqs]
    staged.fill(scheduled, BLOCK, full_rows=True, with_ids=True)
    eager = build_model_inputs(scheduled, BLOCK, torch.device("cpu")).positions.numpy()
    assert staged.packed[POSITIONS, : len(seqs)].tolist() == eager.tolist()
    assert eager[1] == TRAINED_ROPE_OFFSET + seqs[1].request.num_computed_tokens
