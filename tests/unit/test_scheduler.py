"""Scheduler: continuous batching, chunked prefill, FCFS, prefix reuse, preemption, abort, no leaks.

The fake runner simulates paged KV memory: it writes every scheduled token into its slot
(block_id * block_size + offset), reads the whole context back through the block table,
checks it equals the request's tokens, and samples a token from what it read. A wrong
block table, a shared block that got overwritten or an evicted block still in use fails.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvserve.engine.image_input import ImageInput
from kvserve.engine.kv_cache.block_pool import BlockPool
from kvserve.engine.kv_cache.manager import KVCacheManager
from kvserve.engine.outputs import EngineOutput, RunnerOutput, SchedulerOutput
from kvserve.engine.request import FinishReason, Logprob, Request, RequestStatus
from kvserve.engine.sampling_params import SamplingParams
from kvserve.engine.scheduler import RequestTooLongError, Scheduler

VOCAB = 50_000
_arrivals = itertools.count()


class FakeRunner:
    def __init__(self, pool: BlockPool, block_size: int, with_logprobs: bool = False) -> None:
        self.pool = pool
        self.block_size = block_size
        self.with_logprobs = with_logprobs
        self.slots: dict[int, int] = {}

    def _slot(self, block_ids: list[int], position: int) -> int:
        block_id = block_ids[position // self.block_size]
        assert block_id != 0, "the null block is never part of a block table"
        return block_id * self.block_size + position % self.block_size

    def execute(self, plan: SchedulerOutput) -> RunnerOutput:
        tokens = {s.request.request_id: s.request.all_token_ids for s in plan.scheduled}
        for s in plan.scheduled:  # write all KV of the step first, as attention layers do
            for position in range(s.start, s.start + s.num_new_tokens):
                block = self.pool.blocks[s.block_ids[position // self.block_size]]
                assert block.block_hash is None, "a cached block is immutable"
                self.slots[self._slot(s.block_ids, position)] = tokens[s.request.request_id][position]
        result = RunnerOutput()
        for s in plan.scheduled:
            end = s.start + s.num_new_tokens
            context = [self.slots.get(self._slot(s.block_ids, p)) for p in range(end)]
            assert context == tokens[s.request.request_id][:end], "KV read back differs from the tokens"
            if s.samples:
                token_id = (context[-1] + sum(context) + 1) % VOCAB
                result.sampled_token_ids[s.request.request_id] = token_id
                if self.with_logprobs:
                    result.logprobs[s.request.request_id] = Logprob(token_id, -0.5)
        return result


def make_request(request_id: str, token_ids: list[int], max_tokens: int = 8, **kwargs: object) -> Request:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, **kwargs)  # type: ignore[arg-type]
    return Request(request_id, list(token_ids), params, arrival_time=next(_arrivals))


def random_tokens(num_tokens: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(num_tokens)]


def make_scheduler(
    block_size: int = 16, num_blocks: int = 1025, max_num_seqs: int = 8, budget: int = 512, **kwargs: int
) -> tuple[Scheduler, FakeRunner]:
    kv = KVCacheManager(block_size, num_blocks, extra_key=b"test-model")
    scheduler = Scheduler(max_num_seqs, budget, kv, max_model_len=100_000, **kwargs)
    return scheduler, FakeRunner(kv.pool, block_size)


def step(scheduler: Scheduler, runner: FakeRunner) -> tuple[SchedulerOutput, list[EngineOutput]]:
    plan = scheduler.schedule()
    assert plan.num_batched_tokens <= scheduler.max_num_batched_tokens
    assert len(plan.scheduled) <= scheduler.max_num_seqs >= scheduler.num_running
    kinds = [s.is_decode for s in plan.scheduled]
    assert kinds == sorted(kinds, reverse=True), "decodes come before prefills"
    return plan, scheduler.update(plan, runner.execute(plan))


def run_to_completion(
    scheduler: Scheduler, runner: FakeRunner, max_steps: int = 10_000
) -> dict[str, list[EngineOutput]]:
    outputs: dict[str, list[EngineOutput]] = {}
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            return outputs
        for output in step(scheduler, runner)[1]:
            outputs.setdefault(output.request_id, []).append(output)
    raise AssertionError("requests did not finish")


def tokens_of(outputs: list[EngineOutput]) -> list[int]:
    return [token for output in outputs for token in output.new_token_ids]


def test_single_request_runs_to_max_tokens_and_returns_its_blocks() -> None:
    scheduler, runner = make_scheduler()
    initial_free = scheduler.kv.num_free_blocks
    scheduler.add_request(make_request("a", random_tokens(40, 0), max_tokens=5))
    outputs = run_to_completion(scheduler, runner)["a"]
    assert len(tokens_of(outputs)) == 5 and len(outputs) == 5
    assert [o.finish_reason for o in outputs] == [None] * 4 + [FinishReason.LENGTH]
    assert outputs[-1].num_prompt_tokens == 40 and outputs[-1].num_cached_tokens == 0
    assert scheduler.kv.num_free_blocks == initial_free and scheduler.num_running == 0


def test_fcfs_admission_bounded_by_max_num_seqs() -> None:
    scheduler, runner = make_scheduler(max_num_seqs=2)
    for index, max_tokens in enumerate((2, 4, 3, 1)):
        scheduler.add_request(make_request(f"r{index}", random_tokens(10, index), max_tokens=max_tokens))
    plan, _ = step(scheduler, runner)
    assert [s.request.request_id for s in plan.scheduled] == ["r0", "r1"]
    assert scheduler.num_waiting == 2
    plan, outputs = step(scheduler, runner)
    assert [o.request_id for o in outputs if o.finished] == ["r0"]
    plan, _ = step(scheduler, runner)
    assert [s.request.request_id for s in plan.scheduled] == ["r1", "r2"]  # r2 before r3
    assert set(run_to_completion(scheduler, runner)) == {"r1", "r2", "r3"}


def test_decodes_keep_running_while_a_long_prompt_prefills_in_chunks() -> None:
    scheduler, runner = make_scheduler(budget=512)
    scheduler.add_request(make_request("chat", random_tokens(20, 1), max_tokens=100))
    step(scheduler, runner)  # prefill of the short prompt
    scheduler.add_request(make_request("long", random_tokens(5000, 2), max_tokens=2))
    num_prefill_steps = 0
    while True:
        plan, outputs = step(scheduler, runner)
        assert plan.scheduled[0].request.request_id == "chat" and plan.scheduled[0].num_new_tokens == 1
        assert plan.num_batched_tokens <= 512
        assert any(o.request_id == "chat" and len(o.new_token_ids) == 1 for o in outputs)
        num_prefill_steps += 1
        if any(o.request_id == "long" for o in outputs):
            break
    assert num_prefill_steps == -(-5000 // 511)


def test_a_prompt_alone_takes_the_full_budget_and_a_decoding_stream_keeps_steps_short() -> None:
    """The CPU default: 2,048 tokens a step while nothing decodes, 512 while a stream waits on it."""
    scheduler, runner = make_scheduler(budget=2048, budget_with_decodes=512)
    scheduler.add_request(make_request("first", random_tokens(5000, 4), max_tokens=3))
    chunks = []
    while not scheduler.num_running or not scheduler.running[0].output_token_ids:
        plan, _ = step(scheduler, runner)
        chunks += [s.num_new_tokens for s in plan.scheduled]
    assert chunks == [2048, 2048, 904]
    scheduler.add_request(make_request("second", random_tokens(1500, 5), max_tokens=1))
    plan, _ = step(scheduler, runner)  # "first" decodes: the step keeps to 512 tokens
    assert [(s.request.request_id, s.num_new_tokens) for s in plan.scheduled] == [
        ("first", 1),
        ("second", 511),
    ]
    run_to_completion(scheduler, runner)
    scheduler.add_request(make_request("third", random_tokens(3000, 6), max_tokens=1))
    plan, _ = step(scheduler, runner)  # alone again: the full budget
    assert [s.num_new_tokens for s in plan.scheduled] == [2048]


def test_long_prefill_token_threshold_caps_each_chunk() -> None:
    scheduler, runner = make_scheduler(budget=512, long_prefill_token_threshold=100)
    scheduler.add_request(make_request("long", random_tokens(450, 3), max_tokens=1))
    chunks = []
    while scheduler.has_unfinished_requests():
        plan, _ = step(scheduler, runner)
        chunks += [s.num_new_tokens for s in plan.scheduled]
    assert chunks == [100, 100, 100, 100, 50]


def _chunks(scheduler: Scheduler, runner: FakeRunner, request: Request) -> list[int]:
    """The request's prefill chunks (not through step(): a whole image may exceed the budget)."""
    scheduler.add_request(request)
    chunks = []
    while request.num_computed_tokens < request.num_prompt_tokens:
        plan = scheduler.schedule()
        chunks += [s.num_new_tokens for s in plan.scheduled]
        scheduler.update(plan, runner.execute(plan))
    run_to_completion(scheduler, runner)
    return chunks


@pytest.mark.parametrize(("whole", "expected"), [(False, [10, 10, 10]), (True, [6, 12, 10, 2])])
def test_chunks_keep_images_whole_only_where_the_model_needs_it(whole: bool, expected: list[int]) -> None:
    """Image span [6, 18): cut short before it, then taken whole past the 10-token budget."""
    scheduler, runner = make_scheduler(block_size=4, budget=10, keep_images_whole=whole)
    image = ImageInput("h", 6, 12, torch.zeros(1))
    request = make_request("a", random_tokens(30, 20), max_tokens=2)
    request.images = (image,)
    assert _chunks(scheduler, runner, request) == expected


def test_a_prefix_hit_never_ends_inside_a_whole_image() -> None:
    scheduler, runner = make_scheduler(block_size=4, budget=10, keep_images_whole=True)
    prompt = random_tokens(30, 21)
    first = make_request("a", prompt, max_tokens=2)
    first.images = (ImageInput("h", 6, 12, torch.zeros(1)),)
    _chunks(scheduler, runner, first)
    # Same tokens and image up to 16, inside the image: the hit goes back to the image's first block.
    branch = make_request("b", prompt[:16] + random_tokens(14, 22), max_tokens=2)
    branch.images = first.images
    assert _chunks(scheduler, runner, branch) == [2, 12, 10, 2]
    assert branch.num_cached_tokens == 4


def test_prefix_reuse_for_repeat_branch_and_extension() -> None:
    scheduler, runner = make_scheduler()
    prompt = random_tokens(1000, 4)
    scheduler.add_request(make_request("first", prompt, max_tokens=40))
    first_tokens = tokens_of(run_to_completion(scheduler, runner)["first"])
    scheduler.add_request(make_request("repeat", prompt, max_tokens=40))
    scheduler.add_request(make_request("branch", prompt[:500] + random_tokens(200, 5), max_tokens=4))
    extension = prompt + first_tokens + random_tokens(30, 6)
    scheduler.add_request(make_request("extension", extension, max_tokens=4))
    outputs = run_to_completion(scheduler, runner)
    assert outputs["repeat"][-1].num_cached_tokens == 992
    assert tokens_of(outputs["repeat"]) == first_tokens  # same KV, same tokens
    assert outputs["branch"][-1].num_cached_tokens == 496
    assert outputs["extension"][-1].num_cached_tokens == (1000 + 40 - 1) // 16 * 16


def test_reuse_from_a_running_requests_blocks() -> None:
    scheduler, runner = make_scheduler()
    prompt = random_tokens(300, 7)
    scheduler.add_request(make_request("owner", prompt, max_tokens=50))
    step(scheduler, runner)  # owner's prompt is computed and cached; it keeps decoding
    scheduler.add_request(make_request("sharer", prompt + [1, 2, 3], max_tokens=3))
    plan = scheduler.schedule()
    assert plan.scheduled[-1].start == 288 and plan.scheduled[-1].num_new_tokens == 303 - 288
    shared = scheduler.kv.block_ids("owner")[:18]
    assert scheduler.kv.block_ids("sharer")[:18] == shared
    assert all(scheduler.kv.pool.blocks[block_id].ref_cnt == 2 for block_id in shared)
    scheduler.update(plan, runner.execute(plan))
    outputs = run_to_completion(scheduler, runner)
    assert outputs["sharer"][-1].num_cached_tokens == 288
    assert scheduler.kv.num_free_blocks == scheduler.kv.num_usable_blocks


def test_preemption_by_recompute_gives_the_same_tokens() -> None:
    prompts = {f"r{i}": random_tokens(30 + 7 * i, 10 + i) for i in range(4)}

    def run(num_blocks: int) -> tuple[dict[str, list[int]], int]:
        scheduler, runner = make_scheduler(block_size=4, num_blocks=num_blocks, budget=64)
        requests = [make_request(rid, prompt, max_tokens=24) for rid, prompt in prompts.items()]
        for request in requests:
            scheduler.add_request(request)
        outputs = run_to_completion(scheduler, runner)
        assert scheduler.kv.num_free_blocks == num_blocks - 1
        return {rid: tokens_of(o) for rid, o in outputs.items()}, sum(r.num_preemptions for r in requests)

    roomy, roomy_preemptions = run(num_blocks=200)
    tight, tight_preemptions = run(num_blocks=30)  # the longest request needs 21 of 29 blocks
    assert roomy_preemptions == 0 and tight_preemptions > 0
    assert tight == roomy and all(len(tokens) == 24 for tokens in tight.values())


def test_preemption_takes_the_latest_arrival_and_requeues_it_first() -> None:
    scheduler, runner = make_scheduler(block_size=4, num_blocks=9, budget=64)  # 8 usable blocks
    scheduler.add_request(make_request("early", list(range(1, 12)), max_tokens=20))
    scheduler.add_request(make_request("late", list(range(20, 31)), max_tokens=20))
    step(scheduler, runner)  # 3 + 3 blocks
    preempted = []
    while not preempted:
        plan, _ = step(scheduler, runner)
        preempted = plan.preempted_ids
    assert preempted == ["late"] and scheduler.waiting[0].request_id == "late"
    late = scheduler.waiting[0]
    assert late.status == RequestStatus.PREEMPTED and late.num_computed_tokens == 0
    assert late.num_output_tokens > 0 and scheduler.kv.block_ids("late") == []
    outputs = run_to_completion(scheduler, runner)
    assert outputs["late"][-1].num_cached_tokens == 0  # reported from the first admission


def test_abort_takes_effect_at_the_next_step_for_running_and_waiting() -> None:
    scheduler, runner = make_scheduler(max_num_seqs=1)
    initial_free = scheduler.kv.num_free_blocks
    scheduler.add_request(make_request("running", random_tokens(50, 20), max_tokens=100))
    scheduler.add_request(make_request("waiting", random_tokens(50, 21), max_tokens=100))
    step(scheduler, runner)
    scheduler.abort_request("running")
    scheduler.abort_request("waiting")
    scheduler.abort_request("unknown")
    assert scheduler.kv.num_free_blocks < initial_free  # nothing is freed before the step boundary
    plan, outputs = step(scheduler, runner)
    assert plan.is_empty and [r.request_id for r in plan.aborted] == ["running", "waiting"]
    assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in outputs] == [
        ("running", (), FinishReason.ABORT),
        ("waiting", (), FinishReason.ABORT),
    ]
    assert outputs[0].num_prompt_tokens == 50
    assert scheduler.kv.num_free_blocks == initial_free and not scheduler.has_unfinished_requests()
    scheduler.abort_request("running")  # already finished: a no-op
    assert step(scheduler, runner)[1] == []


def test_stop_on_eos_stop_token_and_ignore_eos() -> None:
    prompt = random_tokens(20, 30)
    scheduler, runner = make_scheduler()
    scheduler.add_request(make_request("probe", prompt, max_tokens=6))
    expected = tokens_of(run_to_completion(scheduler, runner)["probe"])
    eos = expected[2]
    scheduler.add_request(Request("eos", prompt, SamplingParams(max_tokens=6), eos_token_ids=(eos,)))
    scheduler.add_request(make_request("stop", prompt, max_tokens=6, stop_token_ids=(expected[1],)))
    ignore = SamplingParams(max_tokens=6, ignore_eos=True)
    scheduler.add_request(Request("ignore", prompt, ignore, eos_token_ids=(eos,)))
    outputs = run_to_completion(scheduler, runner)
    assert tokens_of(outputs["eos"]) == expected[:3] and outputs["eos"][-1].finish_reason == FinishReason.STOP
    assert tokens_of(outputs["stop"]) == expected[:2]
    assert tokens_of(outputs["ignore"]) == expected
    assert outputs["ignore"][-1].finish_reason == FinishReason.LENGTH


def test_context_limit_finishes_with_length_and_rejects_prompts_that_cannot_fit() -> None:
    kv = KVCacheManager(4, num_blocks=11)  # 40 tokens of KV
    scheduler = Scheduler(4, 64, kv, max_model_len=30)
    runner = FakeRunner(kv.pool, 4)
    scheduler.add_request(make_request("near", list(range(1, 27)), max_tokens=100))
    assert len(tokens_of(run_to_completion(scheduler, runner)["near"])) == 4  # 26 + 4 = 30
    with pytest.raises(RequestTooLongError):
        scheduler.add_request(make_request("ctx", list(range(30)), max_tokens=1))
    roomy = Scheduler(4, 64, kv, max_model_len=1000)
    with pytest.raises(RequestTooLongError):  # could never be held by the pool
        roomy.add_request(make_request("pool", list(range(40)), max_tokens=1))
    roomy.add_request(make_request("grows", list(range(1, 31)), max_tokens=100))
    assert len(tokens_of(run_to_completion(roomy, runner)["grows"])) == 10
    assert kv.num_free_blocks == 10


def test_logprobs_are_passed_through() -> None:
    scheduler, _ = make_scheduler()
    runner = FakeRunner(scheduler.kv.pool, 16, with_logprobs=True)
    request = make_request("a", random_tokens(10, 40), max_tokens=3, logprobs=0)
    scheduler.add_request(request)
    outputs = run_to_completion(scheduler, runner)["a"]
    assert [o.new_logprobs[0].token_id for o in outputs] == tokens_of(outputs)
    assert len(request.output_logprobs) == 3


# --- property: random interleavings never leak blocks nor exceed budgets ----------------

_PREFIXES = [random_tokens(24, 100 + i) for i in range(3)]
_operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 2), st.integers(1, 30), st.integers(1, 12)),
        st.tuples(st.just("abort"), st.integers(0, 40)),
        st.tuples(st.just("step")),
    ),
    max_size=60,
)


def _check_block_accounting(scheduler: Scheduler) -> None:
    pool = scheduler.kv.pool
    held = [scheduler.kv.block_ids(r.request_id) for r in scheduler.running]
    assert sum(block.ref_cnt for block in pool.blocks) == sum(len(ids) for ids in held)
    assert all(scheduler.kv.block_ids(r.request_id) == [] for r in scheduler.waiting)
    num_in_use = sum(1 for block in pool.blocks if block.ref_cnt > 0)
    assert num_in_use + pool.num_free_blocks == pool.num_usable_blocks
    assert all(r.num_tokens <= scheduler.token_limit(r) for r in scheduler.running)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=_operations, max_num_seqs=st.integers(1, 4), budget=st.integers(1, 24))
def test_random_interleavings_never_leak_blocks(
    operations: list[tuple], max_num_seqs: int, budget: int
) -> None:
    kv = KVCacheManager(4, num_blocks=10)  # 36 tokens: below the context limit, so the pool binds
    scheduler = Scheduler(max_num_seqs, budget, kv, max_model_len=40)
    runner = FakeRunner(kv.pool, 4)
    added: list[str] = []
    finished: dict[str, int] = {}

    def do_step() -> None:
        plan, outputs = step(scheduler, runner)
        if plan.preempted_ids:
            event("preemption")
        for output in outputs:
            assert output.request_id not in finished
            if output.finished:
                finished[output.request_id] = 1
        _check_block_accounting(scheduler)

    for operation in operations:
        if operation[0] == "add":
            _, prefix, length, max_tokens = operation
            request_id = f"r{len(added)}"
            tokens = (_PREFIXES[prefix] + random_tokens(30, len(added)))[:length]
            scheduler.add_request(make_request(request_id, tokens, max_tokens=max_tokens))
            added.append(request_id)
        elif operation[0] == "abort" and added:
            scheduler.abort_request(added[operation[1] % len(added)])
        else:
            do_step()
    for _ in range(2000):
        if not scheduler.has_unfinished_requests():
            break
        do_step()
    assert set(finished) == set(added)
    assert kv.num_free_blocks == kv.num_usable_blocks
