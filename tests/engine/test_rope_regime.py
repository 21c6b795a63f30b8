"""On-demand YaRN on a real engine (tiny random-weight llama trained at 256, --ctx 512): a request
that fits the trained context computes exactly what the unscaled model does, a longer one exactly
what the statically scaled model does, in one batch; KV of one regime is never reused for the other,
in RAM or from disk; an answer that outgrows the trained context is switched and completes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvserve.config import KVStoreConfig
from kvserve.engine.core import EngineCore
from kvserve.engine.request import FinishReason, Request
from kvserve.engine.sampling_params import SamplingParams
from kvserve.models.rope_scaling import ContextRequest
from tests.engine.conftest import VOCAB, load_hf_oracle, make_engine, save_tiny_llama

CTX = 256  # the trained context: short enough that an answer outgrows it in a second
ON_DEMAND = ContextRequest(max_model_len=2 * CTX)  # automatic YaRN x2: on demand
STATIC = ContextRequest(2 * CTX, "yarn")  # --rope-scaling yarn: every request scaled
PLAIN = ContextRequest(max_model_len=CTX)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama-256"), CTX, seed=5)


@pytest.fixture(scope="module")
def hf_tiny(tiny_dir: Path):  # -> transformers model, the oracle of the trained regime
    return load_hf_oracle(tiny_dir)


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _request(engine: EngineCore, request_id: str, prompt: list[int], max_tokens: int) -> Request:
    return engine.make_request(request_id, prompt, SamplingParams(max_tokens=max_tokens, temperature=0))


def _first_step_logits(engine: EngineCore, requests: list[Request]) -> dict[str, torch.Tensor]:
    """The logits of the step that prefills all `requests` together (one batch)."""
    for request in requests:
        engine.add_request(request)
    plan = engine.scheduler.schedule()
    assert len(plan.scheduled) == len(requests) and all(s.samples for s in plan.scheduled)
    logits, rows = engine.runner.forward(plan.scheduled)
    assert logits is not None
    return {s.request.request_id: row for s, row in zip(rows, logits, strict=True)}


def test_the_plan_marks_automatic_yarn_on_demand_and_explicit_yarn_static(tiny_dir: Path) -> None:
    on_demand = make_engine(tiny_dir, context=ON_DEMAND)
    static = make_engine(tiny_dir, context=STATIC)
    assert on_demand.scheduler.rope is not None and on_demand.scheduler.rope.trained_context == CTX
    assert static.scheduler.rope is None
    # The same scaled arithmetic: a scaled request's KV is a static engine's, under the same key.
    assert on_demand.cache_key == static.cache_key


def test_short_and_long_requests_in_one_batch_compute_their_regimes_model(
    tiny_dir: Path, hf_tiny: torch.nn.Module
) -> None:
    short, long = _prompt(20, 1), _prompt(190, 2)  # 190 + min(100, 128) is past 256: scaled
    batches = {}
    for name, context in (("on_demand", ON_DEMAND), ("plain", PLAIN), ("static", STATIC)):
        engine = make_engine(tiny_dir, context=context, max_num_batched_tokens=256, kv_dtype="float32")
        requests = [_request(engine, "short", short, 16), _request(engine, "long", long, 100)]
        batches[name] = _first_step_logits(engine, requests)
        if name == "on_demand":
            assert [r.uses_trained_rope for r in requests] == [True, False]
    got = batches["on_demand"]
    assert torch.equal(got["short"], batches["plain"]["short"])
    assert torch.equal(got["long"], batches["static"]["long"])
    assert (got["long"] - batches["plain"]["long"]).abs().max() > 1e-3  # the regimes differ here
    with torch.no_grad():  # transformers (unscaled) as the oracle of the trained regime
        want = hf_tiny(torch.tensor([short])).logits[0, -1].float()
    torch.testing.assert_close(got["short"], want, atol=2e-4, rtol=0)


def test_greedy_answers_in_a_mixed_batch_are_each_regimes_own(tiny_dir: Path) -> None:
    """Prefill and decode steps of both regimes side by side: the tokens of a one-regime engine."""
    prompts = {"short": (_prompt(20, 3), 24), "long": (_prompt(190, 4), 100)}
    answers: dict[str, dict[str, list[int]]] = {}
    for name, context in (("on_demand", ON_DEMAND), ("plain", PLAIN), ("static", STATIC)):
        engine = make_engine(tiny_dir, context=context, max_num_batched_tokens=64)
        requests = [_request(engine, rid, p, n) for rid, (p, n) in prompts.items()]
        engine.generate(requests)
        answers[name] = {r.request_id: r.output_token_ids for r in requests}
    assert answers["on_demand"]["short"] == answers["plain"]["short"]
    assert answers["on_demand"]["long"] == answers["static"]["long"]


def test_kv_of_one_regime_never_hits_for_the_other_in_ram(tiny_dir: Path) -> None:
    engine = make_engine(tiny_dir, context=ON_DEMAND)
    prompt = _prompt(150, 5)
    engine.generate([_request(engine, "trained", prompt, 8)])
    scaled = _request(engine, "scaled", prompt, 120)  # the same prompt, a longer answer: scaled
    engine.generate([scaled])
    assert not scaled.uses_trained_rope and scaled.num_cached_tokens == 0
    again = _request(engine, "again", prompt, 4)
    engine.generate([again])
    assert again.uses_trained_rope and again.num_cached_tokens == 144


def test_kv_of_one_regime_never_hits_for_the_other_on_disk(tiny_dir: Path, tmp_path: Path) -> None:
    prompt = _prompt(150, 6)
    for preload in (0.0, 0.5):  # read at admission, and preloaded into RAM at start-up
        directory = str(tmp_path / f"kv-{preload}")
        store = KVStoreConfig(
            directory=directory, chunk_tokens=64, min_tokens=64, align_tokens=64, preload_fraction=preload
        )
        first = make_engine(tiny_dir, kv_store=store, context=ON_DEMAND)
        first.generate([_request(first, "trained", prompt, 8)])
        first.shutdown()
        engine = make_engine(tiny_dir, kv_store=store, context=ON_DEMAND)
        scaled = _request(engine, "scaled", prompt, 120)
        engine.generate([scaled])
        assert scaled.num_cached_tokens == 0
        trained = _request(engine, "trained", prompt, 8)
        engine.generate([trained])
        assert trained.uses_trained_rope and trained.num_cached_tokens >= 128
        engine.shutdown()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_an_answer_that_outgrows_the_trained_context_is_switched_and_completes(
    tiny_dir: Path, async_scheduling: bool
) -> None:
    """Trained up to position 255 (the unscaled model's tokens), then its KV recomputed scaled and
    the rest the statically scaled model's continuation; never cut short."""
    prompt = _prompt(120, 7)  # 120 + min(160, 128) fits 256: starts trained
    engine = make_engine(
        tiny_dir, context=ON_DEMAND, async_scheduling=async_scheduling, max_num_batched_tokens=64
    )
    request = _request(engine, "switches", prompt, 160)
    engine.generate([request])
    assert request.finish_reason == FinishReason.LENGTH and request.num_output_tokens == 160
    assert request.num_preemptions == 1 and not request.uses_trained_rope
    num_trained = CTX + 1 - len(prompt)  # outputs sampled before the switch (the last at position 255)

    plain = make_engine(tiny_dir, context=PLAIN)
    unscaled = _request(plain, "plain", prompt, num_trained)
    plain.generate([unscaled])  # the plain engine's context ends one token earlier
    assert request.output_token_ids[: num_trained - 1] == unscaled.output_token_ids

    static = make_engine(tiny_dir, context=STATIC, max_num_batched_tokens=64)
    rest = _request(static, "rest", prompt + request.output_token_ids[:num_trained], 160 - num_trained)
    static.generate([rest])
    assert request.output_token_ids[num_trained:] == rest.output_token_ids
