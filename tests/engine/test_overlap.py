"""Overlapped greedy decode (engine/overlap.py) on CPU, where `launch_greedy` runs eagerly: the same
tokens, stops, prefix-cache blocks and pool accounting as the synchronous engine, across stops in
the middle of a batch, arrivals and aborts during overlapped decoding."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kvserve.engine.core import EngineCore
from kvserve.engine.overlap import can_overlap
from kvserve.engine.request import FinishReason
from kvserve.engine.sampling_params import SamplingParams
from kvserve.engine.scheduler import PENDING_TOKEN
from tests.engine.conftest import VOCAB, make_engine


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def _greedy(max_tokens: int, stop: tuple[int, ...] = ()) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, stop_token_ids=stop)


class _Counting:
    """Counts the runner's overlapped launches, so a test knows the overlapped path really ran."""

    def __init__(self, engine: EngineCore) -> None:
        self.launches = 0
        launch = engine.runner.launch_greedy

        def counted(*args, **kwargs):
            self.launches += 1
            return launch(*args, **kwargs)

        engine.runner.launch_greedy = counted


def _drive(engine: EngineCore, plan: dict[int, list], max_steps: int = 2000):
    """Step the engine; `plan[k]` lists actions before step k: ("add", id, prompt, params) or
    ("abort", id). Returns {id: (tokens, finish_reason)} and the number of steps."""
    tokens: dict[str, list[int]] = {}
    finish: dict[str, FinishReason | None] = {}
    step = 0
    while step < max_steps and (engine.has_unfinished_requests() or any(k >= step for k in plan)):
        for action in plan.get(step, []):
            if action[0] == "add":
                _, request_id, prompt, params = action
                engine.add_request(engine.make_request(request_id, prompt, params))
                tokens[request_id], finish[request_id] = [], None
            else:
                engine.abort_request(action[1])
        for output in engine.step():
            tokens[output.request_id].extend(output.new_token_ids)
            if output.finished:
                finish[output.request_id] = output.finish_reason
        step += 1
    assert not engine.has_unfinished_requests()
    return {r: (tokens[r], finish[r]) for r in tokens}


def _both(tiny_llama_dir: Path, plan: dict[int, list], **engine_args):
    sync_engine = make_engine(tiny_llama_dir, async_scheduling=False, **engine_args)
    overlap_engine = make_engine(tiny_llama_dir, async_scheduling=True, **engine_args)
    counter = _Counting(overlap_engine)
    sync, overlapped = _drive(sync_engine, plan), _drive(overlap_engine, plan)
    for engine in (sync_engine, overlap_engine):  # every block back in the pool
        assert engine.kv_manager.num_free_blocks == engine.kv_manager.num_usable_blocks
    return sync, overlapped, counter.launches


def _stop_token_of(tiny_llama_dir: Path, prompt: list[int], at: int) -> int:
    """The token the model emits at output index `at` for `prompt` (greedy), to stop on it there."""
    engine = make_engine(tiny_llama_dir, async_scheduling=False)
    (out,) = _drive(engine, {0: [("add", "probe", prompt, _greedy(at + 1))]}).values()
    token = out[0][at]
    assert token not in out[0][:at], "pick another prompt: the stop token appears earlier"
    return token


def test_same_tokens_as_sync_with_stops_mid_batch(tiny_llama_dir: Path) -> None:
    prompts = [_prompt(30 + 7 * i, 40 + i) for i in range(4)]
    stop = _stop_token_of(tiny_llama_dir, prompts[1], at=9)
    plan = {
        0: [
            ("add", "a", prompts[0], _greedy(40)),
            ("add", "b", prompts[1], _greedy(40, stop=(stop,))),  # stops on a token in step ~9
            ("add", "c", prompts[2], _greedy(17)),  # stops by length
            ("add", "d", prompts[3], _greedy(2)),  # too short to overlap at all
        ]
    }
    sync, overlapped, launches = _both(tiny_llama_dir, plan)
    assert overlapped == sync
    assert sync["b"][1] == FinishReason.STOP and len(sync["b"][0]) == 10
    assert sync["c"][1] == FinishReason.LENGTH and len(sync["c"][0]) == 17
    assert launches >= 30  # most of "a"'s 40 decode steps were overlapped


def test_stop_on_the_first_row_regathers_the_rest(tiny_llama_dir: Path) -> None:
    # The first row stopping leaves the others at rows 1.. of the pending step's ids: the next
    # launch must gather them, not take a prefix.
    prompts = [_prompt(25, 60 + i) for i in range(3)]
    stop = _stop_token_of(tiny_llama_dir, prompts[0], at=5)
    plan = {0: [("add", "x", prompts[0], _greedy(30, stop=(stop,)))]}
    plan[0] += [("add", f"y{i}", p, _greedy(30)) for i, p in enumerate(prompts[1:])]
    sync, overlapped, launches = _both(tiny_llama_dir, plan)
    assert overlapped == sync and len(sync["x"][0]) == 6 and launches > 20


def test_arrivals_and_aborts_while_overlapping(tiny_llama_dir: Path) -> None:
    plan = {
        0: [("add", "long", _prompt(50, 1), _greedy(60)), ("add", "gone", _prompt(20, 2), _greedy(60))],
        8: [("add", "late", _prompt(300, 3), _greedy(12))],  # its prefill chunks interrupt the overlap
        20: [("abort", "gone")],
        30: [("add", "later", _prompt(10, 4), _greedy(5))],
    }
    sync, overlapped, launches = _both(tiny_llama_dir, plan, max_num_batched_tokens=64)
    assert overlapped["gone"][1] == sync["gone"][1] == FinishReason.ABORT
    # The abort lands one step later when a step is pending: the tokens before it agree.
    n = min(len(sync["gone"][0]), len(overlapped["gone"][0]))
    assert n >= 15 and overlapped["gone"][0][:n] == sync["gone"][0][:n]
    for request_id in ("long", "late", "later"):
        assert overlapped[request_id] == sync[request_id], request_id
    assert launches >= 30


def test_prefix_cache_blocks_hold_the_real_tokens(tiny_llama_dir: Path) -> None:
    # Blocks cached while tokens were pending must hash the tokens that replaced the placeholders:
    # a follow-up prompt of prompt + output hits them exactly as after a synchronous run.
    prompt = _prompt(40, 9)
    for async_scheduling in (False, True):
        engine = make_engine(tiny_llama_dir, async_scheduling=async_scheduling)
        ((first, _),) = _drive(engine, {0: [("add", "one", prompt, _greedy(50))]}).values()
        follow_up = engine.make_request("two", prompt + first + [1, 2, 3], _greedy(4))
        engine.generate([follow_up])
        assert follow_up.num_cached_tokens == (40 + 50 - 1) // 16 * 16


def test_can_overlap_rules(tiny_llama_dir: Path) -> None:
    engine = make_engine(tiny_llama_dir, async_scheduling=True)
    scheduler = engine.scheduler
    free = engine.kv_manager.num_free_blocks
    assert not can_overlap(scheduler, free)  # nothing running
    request = engine.make_request("r", _prompt(20, 5), _greedy(3))
    engine.add_request(request)
    assert not can_overlap(scheduler, free)  # waiting
    engine.step()  # prefill: one output token
    assert can_overlap(scheduler, engine.kv_manager.num_free_blocks)
    assert not can_overlap(scheduler, 0)  # the pool could not grow the request
    engine.step()  # launched, token 2 pending
    assert request.output_token_ids[-1] == PENDING_TOKEN
    assert not can_overlap(scheduler, engine.kv_manager.num_free_blocks)  # token 3 would end it by max_tokens
    engine.abort_request("r")
    assert not can_overlap(scheduler, engine.kv_manager.num_free_blocks)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, max_tokens=20, seed=1),
        SamplingParams(temperature=0.0, max_tokens=20, logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=20, presence_penalty=0.5),
    ],
    ids=["sampling", "logprobs", "penalty"],
)
def test_non_plain_greedy_is_never_overlapped(tiny_llama_dir: Path, params: SamplingParams) -> None:
    engine = make_engine(tiny_llama_dir, async_scheduling=True)
    counter = _Counting(engine)
    engine.generate([engine.make_request("r", _prompt(20, 6), params)])
    assert counter.launches == 0


def test_shutdown_reads_the_pending_step(tiny_llama_dir: Path) -> None:
    engine = make_engine(tiny_llama_dir, async_scheduling=True)
    request = engine.make_request("r", _prompt(20, 7), _greedy(30))
    engine.add_request(request)
    for _ in range(5):
        engine.step()
    assert request.output_token_ids[-1] == PENDING_TOKEN
    engine.shutdown()
    assert PENDING_TOKEN not in request.output_token_ids and len(request.output_token_ids) == 5
