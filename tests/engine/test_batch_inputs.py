"""`build_model_inputs`: the flat batch of a step, checked token by token against its definition."""

from __future__ import annotations

import torch

from kvserve.engine.outputs import ScheduledRequest
from kvserve.engine.request import Request
from kvserve.engine.runner.batch import build_model_inputs
from kvserve.engine.sampling_params import SamplingParams

BLOCK = 4


def _scheduled(
    name: str, prompt_len: int, outputs: int, computed: int, new: int, first_block: int
) -> ScheduledRequest:
    request = Request(name, [1000 + 10 * first_block + i for i in range(prompt_len)], SamplingParams())
    request.output_token_ids = [500 + i for i in range(outputs)]
    request.num_computed_tokens = computed
    num_blocks = -(-(computed + new) // BLOCK)
    # Scattered, non-monotonic block ids: a slot must come from the table, not from arithmetic.
    return ScheduledRequest(request, new, [first_block + 7 * i % 11 + 100 * i for i in range(num_blocks)])


def test_a_mixed_step_matches_the_per_token_definition() -> None:
    scheduled = [
        _scheduled("d0", 5, 3, 7, 1, 2),  # decodes first: the scheduler's order
        _scheduled("d1", 9, 1, 9, 1, 40),
        _scheduled("chunk", 13, 0, 4, 6, 80),  # a prefill chunk in the middle of its prompt: no sample
        _scheduled("cached", 10, 0, 8, 2, 120),  # the tail of a prefix-cache hit: samples
        _scheduled("one", 6, 0, 5, 1, 160),  # a one-token prompt tail: not a decode
    ]
    inputs = build_model_inputs(scheduled, BLOCK, torch.device("cpu"))

    tokens, positions, slots = [], [], []
    for s in scheduled:
        for t in range(s.start, s.start + s.num_new_tokens):
            tokens.append(s.request.all_token_ids[t])
            positions.append(t)
            slots.append(s.block_ids[t // BLOCK] * BLOCK + t % BLOCK)
    assert inputs.input_ids.tolist() == tokens
    assert inputs.positions.tolist() == positions
    attn = inputs.attn
    assert attn.slot_mapping.tolist() == slots
    assert attn.query_start_loc_cpu == [0, 1, 2, 8, 10, 11]
    assert attn.seq_lens.tolist() == attn.seq_lens_cpu == [8, 10, 10, 10, 6]
    assert attn.context_lens_cpu == [7, 9, 4, 8, 5]
    assert attn.num_decodes == 2
    assert attn.computes_prompt
    width = max(len(s.block_ids) for s in scheduled)
    assert attn.block_tables.tolist() == [s.block_ids + [0] * (width - len(s.block_ids)) for s in scheduled]
    assert [s.request.request_id for s in inputs.sampling] == ["d0", "d1", "cached", "one"]
    assert inputs.logits_indices.tolist() == [0, 1, 9, 10]
    assert all(t.dtype == torch.int64 for t in (inputs.input_ids, inputs.positions, attn.slot_mapping))


def test_an_all_decode_step_computes_no_prompt() -> None:
    scheduled = [_scheduled(f"d{i}", 5, 2, 6, 1, 10 * i) for i in range(3)]
    inputs = build_model_inputs(scheduled, BLOCK, torch.device("cpu"))
    assert inputs.attn.num_decodes == 3 and not inputs.attn.computes_prompt
    assert inputs.positions.tolist() == [6, 6, 6]
    assert inputs.input_ids.tolist() == [501, 501, 501]
