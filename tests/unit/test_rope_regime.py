"""On-demand RoPE scaling in the engine's pure core: the rule that picks a request's regime, chain
hashes that keep the regimes' KV apart, the switch of an answer that outgrows the trained context,
and the regime in tensor-parallel step plans."""

from __future__ import annotations

import pickle

from kvserve.engine.kv_cache.block_hash import compute_block_hashes
from kvserve.engine.request import FinishReason
from kvserve.engine.rope_regime import OnDemandRope
from kvserve.engine.tensor_parallel.plan import PlanDecoder, PlanEncoder
from tests.unit.test_scheduler import make_request, make_scheduler, random_tokens, run_to_completion, step

TRAINED = 64  # the trained context of these tests' on-demand rule


def test_a_request_runs_trained_when_its_prompt_and_answer_reserve_fit() -> None:
    rope = OnDemandRope(8192)
    assert rope.fits(4096, 32_000)  # half the context: trained whatever max_tokens says
    assert not rope.fits(4097, 32_000)
    assert rope.fits(8000, 192) and not rope.fits(8000, 193)  # a short answer reserves only itself
    assert rope.fits(8191, 1) and not rope.fits(8192, 1)


def test_admission_picks_the_regime_and_it_keys_the_chain_hashes() -> None:
    scheduler, _runner = make_scheduler(block_size=4, rope=OnDemandRope(TRAINED))  # type: ignore[arg-type]
    prompt = random_tokens(40, 1)
    trained = make_request("trained", prompt, max_tokens=8)  # 40 + 8 fits 64
    scaled = make_request("scaled", prompt, max_tokens=32)  # 40 + 32 does not
    scheduler.add_request(trained)
    scheduler.add_request(scaled)
    assert trained.uses_trained_rope and not scaled.uses_trained_rope
    kv = scheduler.kv
    assert kv.block_hashes(scaled) == compute_block_hashes(prompt, 4, b"test-model")  # a static engine's
    assert not set(kv.block_hashes(trained)) & set(kv.block_hashes(scaled))


def test_one_regime_never_reuses_the_others_kv() -> None:
    scheduler, runner = make_scheduler(block_size=4, rope=OnDemandRope(TRAINED))  # type: ignore[arg-type]
    prompt = random_tokens(40, 2)
    scheduler.add_request(make_request("first", prompt, max_tokens=8))
    run_to_completion(scheduler, runner)
    scaled = make_request("scaled", prompt, max_tokens=32)
    scheduler.add_request(scaled)
    run_to_completion(scheduler, runner)
    assert scaled.num_cached_tokens == 0  # the trained blocks are cached, but not for it
    again = make_request("again", prompt, max_tokens=4)
    scheduler.add_request(again)
    run_to_completion(scheduler, runner)
    assert again.uses_trained_rope and again.num_cached_tokens == 36  # the first request's blocks


def test_an_answer_that_outgrows_the_trained_context_switches_regime_and_completes() -> None:
    """Its KV is recomputed under the scaled regime (the fake runner checks every read), it keeps its
    output and gets every token it asked for: the same tokens as an engine with one regime."""
    prompt = random_tokens(30, 3)  # 30 + min(60, 32) fits 64: starts trained, reaches 90 tokens
    scheduler, runner = make_scheduler(block_size=4, budget=16, rope=OnDemandRope(TRAINED))  # type: ignore[arg-type]
    request = make_request("long", prompt, max_tokens=60)
    scheduler.add_request(request)
    assert request.uses_trained_rope
    starts = []
    while scheduler.has_unfinished_requests():
        plan, _ = step(scheduler, runner)
        starts += [(s.start, s.request.uses_trained_rope) for s in plan.scheduled]
        assert not request.uses_trained_rope or request.num_tokens <= TRAINED + 1
    assert request.finish_reason == FinishReason.LENGTH and request.num_output_tokens == 60
    assert request.num_preemptions == 1 and not request.uses_trained_rope
    # Computed as trained up to position 63, then again from 0, scaled.
    assert max(start for start, trained in starts if trained) < TRAINED
    assert (0, False) in starts
    one_regime, runner = make_scheduler(block_size=4, budget=16)
    same = make_request("same", prompt, max_tokens=60)
    one_regime.add_request(same)
    run_to_completion(one_regime, runner)
    assert same.output_token_ids == request.output_token_ids


def test_step_plans_carry_the_regime_to_the_other_ranks() -> None:
    scheduler, runner = make_scheduler(block_size=4, budget=16, rope=OnDemandRope(TRAINED))  # type: ignore[arg-type]
    scheduler.add_request(make_request("switches", random_tokens(30, 4), max_tokens=40))
    scheduler.add_request(make_request("scaled", random_tokens(60, 5), max_tokens=8))
    encoder, decoder = PlanEncoder(), PlanDecoder()
    seen = set()
    while scheduler.has_unfinished_requests():
        plan = scheduler.schedule()
        rebuilt = decoder.decode(pickle.loads(pickle.dumps(encoder.encode(plan.scheduled))))
        regimes = [(s.request.request_id, s.request.uses_trained_rope) for s in plan.scheduled]
        assert [(s.request.request_id, s.request.uses_trained_rope) for s in rebuilt] == regimes
        seen.update(regimes)
        outputs = scheduler.update(plan, runner.execute(plan))
        encoder.release([o.request_id for o in outputs if o.finished])
    assert seen == {("switches", True), ("switches", False), ("scaled", False)}
