"""Step plans: a worker rebuilds exactly rank 0's batch (tokens, positions, block tables, which
rows sample) from the deltas, through chunked prefill, preemption and finished requests."""

from __future__ import annotations

import pickle

from kvserve.engine.outputs import ScheduledRequest
from kvserve.engine.tensor_parallel.plan import PlanDecoder, PlanEncoder
from tests.unit.test_scheduler import make_request, make_scheduler, random_tokens


def _view(s: ScheduledRequest) -> tuple:
    tokens = s.request.all_token_ids
    return (
        s.request.request_id,
        s.start,
        s.num_new_tokens,
        s.block_ids,
        s.samples,
        tokens[: s.start + s.num_new_tokens],
    )


def test_workers_rebuild_every_step_of_rank_0() -> None:
    # 12 blocks of 4 tokens for 4 requests of up to 26 tokens: preemption is certain.
    scheduler, runner = make_scheduler(block_size=4, num_blocks=12, max_num_seqs=4, budget=16)
    for i in range(4):
        scheduler.add_request(make_request(f"r{i}", random_tokens(10 + 3 * i, i), max_tokens=8))
    encoder, decoder = PlanEncoder(), PlanDecoder()
    num_preempted = num_resent_tables = 0
    while scheduler.has_unfinished_requests():
        plan = scheduler.schedule()
        num_preempted += len(plan.preempted_ids)
        wire = pickle.loads(pickle.dumps(encoder.encode(plan.scheduled)))  # what broadcast_object sends
        num_resent_tables += sum(s.num_kept_blocks == 0 and s.prompt_token_ids is None for s in wire.steps)
        rebuilt = decoder.decode(wire)
        assert [_view(s) for s in rebuilt] == [_view(s) for s in plan.scheduled]
        outputs = scheduler.update(plan, runner.execute(plan))
        encoder.release([o.request_id for o in outputs if o.finished])
    assert num_preempted > 0 and num_resent_tables > 0
    decoder.decode(encoder.encode([]))  # the last releases reach the worker with the next plan
    assert decoder.num_sequences == 0


def test_a_decode_step_ships_one_token_and_no_old_blocks() -> None:
    scheduler, runner = make_scheduler(block_size=4)
    scheduler.add_request(make_request("a", random_tokens(9, 0), max_tokens=4))
    encoder = PlanEncoder()
    for _ in range(3):  # prefill, then two decodes
        plan = scheduler.schedule()
        wire = encoder.encode(plan.scheduled)
        scheduler.update(plan, runner.execute(plan))
    (step,) = wire.steps
    assert step.prompt_token_ids is None and len(step.new_output_ids) == 1
    assert step.num_kept_blocks == 3 and step.new_block_ids == []  # 10 tokens: still in block 3
