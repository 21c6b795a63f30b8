"""EngineCore end to end on a tiny random llama: HF parity, batch invariance, prefix reuse,
chunked prefill, preemption and block accounting."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from kvserve.engine.core import EngineCore
from kvserve.engine.request import FinishReason
from kvserve.engine.sampling_params import SamplingParams
from tests.engine.conftest import VOCAB, make_engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def _run(engine: EngineCore, prompts: list[list[int]], params: SamplingParams = GREEDY):
    requests = [engine.make_request(f"r{i}", p, params) for i, p in enumerate(prompts)]
    outputs = engine.generate(requests)
    tokens = [[t for o in outputs[r.request_id] for t in o.new_token_ids] for r in requests]
    return tokens, requests


def test_greedy_matches_transformers(engine: EngineCore, hf_tiny_llama) -> None:
    prompts = [_prompt(n, seed) for seed, n in enumerate([5, 40, 300])]
    tokens, _ = _run(engine, prompts)
    for prompt, got in zip(prompts, tokens):
        with torch.no_grad():
            want = hf_tiny_llama.generate(
                torch.tensor([prompt]), max_new_tokens=24, do_sample=False, min_new_tokens=24
            )[0, len(prompt) :].tolist()
        assert got == want


def test_batch_invariance_8_concurrent(tiny_llama_dir: Path) -> None:
    prompts = [_prompt(20 + 13 * i, 100 + i) for i in range(8)]
    together, _ = _run(make_engine(tiny_llama_dir), prompts)
    alone = [_run(make_engine(tiny_llama_dir), [p])[0][0] for p in prompts]
    assert together == alone


def test_chunked_prefill_equals_one_shot(tiny_llama_dir: Path) -> None:
    prompt = _prompt(700, 7)
    chunked, _ = _run(make_engine(tiny_llama_dir, max_num_batched_tokens=64), [prompt])
    one_shot, _ = _run(make_engine(tiny_llama_dir, max_num_batched_tokens=1024), [prompt])
    assert chunked == one_shot


def test_prefix_reuse_extension_repeat_branch(tiny_llama_dir: Path) -> None:
    engine = make_engine(tiny_llama_dir)
    base = _prompt(1000, 11)
    first, _ = _run(engine, [base])
    cases = {
        "extension": base + first[0] + _prompt(50, 12),
        "repeat": base,
        "branch": base[:500] + _prompt(200, 13),
    }
    # Full 16-token blocks whose KV exists: the last sampled token of the first request was never
    # fed back, so its KV (and the block it would complete) is not cached.
    expected_cached = {"extension": (1000 + 24 - 1) // 16 * 16, "repeat": 992, "branch": 496}
    for name, prompt in cases.items():
        tokens, (request,) = _run(engine, [prompt])
        assert request.num_cached_tokens == expected_cached[name], name
        uncached, _ = _run(make_engine(tiny_llama_dir), [prompt])
        assert tokens == uncached, name
    assert engine.kv_manager.num_free_blocks == engine.kv_manager.num_usable_blocks


def test_preemption_by_recompute_keeps_tokens(tiny_llama_dir: Path) -> None:
    prompts = [_prompt(100, 200 + i) for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    roomy, _ = _run(make_engine(tiny_llama_dir), prompts, params)
    # 4 x 140 tokens need ~36 blocks of 16; give the pool ~24 so requests preempt each other.
    tight = make_engine(tiny_llama_dir, kv_cache_memory_mb=1)
    tight.kv_manager = tight.scheduler.kv = _shrunk(tight, num_blocks=25)
    tokens, requests = _run(tight, prompts, params)
    assert tokens == roomy
    assert sum(r.num_preemptions for r in requests) > 0
    assert tight.kv_manager.num_free_blocks == tight.kv_manager.num_usable_blocks


def _shrunk(engine: EngineCore, num_blocks: int):
    from kvserve.engine.kv_cache.manager import KVCacheManager

    return KVCacheManager(engine.config.cache.block_size, num_blocks, extra_key=engine.loaded.fingerprint)


def test_abort_and_completion_return_every_block(engine: EngineCore) -> None:
    free_at_start = engine.kv_manager.num_free_blocks
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    requests = [engine.make_request(f"a{i}", _prompt(300, 300 + i), params) for i in range(4)]
    for r in requests:
        engine.add_request(r)
    for _ in range(6):
        engine.step()
    engine.abort_request("a0")
    engine.abort_request("a2")
    finishes = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                finishes[o.request_id] = o.finish_reason
    assert finishes == {
        "a0": FinishReason.ABORT,
        "a1": FinishReason.LENGTH,
        "a2": FinishReason.ABORT,
        "a3": FinishReason.LENGTH,
    }
    assert engine.kv_manager.num_free_blocks == free_at_start
    assert engine.scheduler.num_running == 0 and engine.scheduler.num_waiting == 0


def test_seeded_sampling_is_reproducible_across_batches(tiny_llama_dir: Path) -> None:
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=1234, max_tokens=16, ignore_eos=True)
    prompt = _prompt(30, 5)
    alone, _ = _run(make_engine(tiny_llama_dir), [prompt], params)
    others = [_prompt(25, 6 + i) for i in range(3)]
    mixed, _ = _run(make_engine(tiny_llama_dir), [*others, prompt], params)
    assert mixed[-1] == alone[0]


# Logprobs against transformers' fp32 forward: exact KV to 1e-4; the default fp16 KV's rounding
# moves them by ~1e-4 (1.2e-4 seen).
@pytest.mark.parametrize(
    ("kv_dtype", "tolerance"), [("float32", 1e-4), ("auto", 1e-3)], ids=["fp32-kv", "fp16-kv"]
)
def test_logprobs_flow_through_the_engine(
    tiny_llama_dir: Path, hf_tiny_llama, kv_dtype: str, tolerance: float
) -> None:
    engine = make_engine(tiny_llama_dir, kv_dtype=kv_dtype)
    prompt = _prompt(12, 21)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=2)
    request = engine.make_request("lp", prompt, params)
    outputs = engine.generate([request])["lp"]
    logprobs = [lp for o in outputs for lp in o.new_logprobs]
    tokens = [t for o in outputs for t in o.new_token_ids]
    assert [lp.token_id for lp in logprobs] == tokens
    with torch.no_grad():
        want = torch.log_softmax(hf_tiny_llama(torch.tensor([prompt + tokens])).logits[0].float(), -1)
    for i, lp in enumerate(logprobs):
        row = want[len(prompt) - 1 + i]
        assert abs(lp.logprob - row[lp.token_id].item()) < tolerance
        assert [t for t, _ in lp.top] == row.topk(2).indices.tolist()  # greedy: the best is sampled


def test_chunked_prefill_reports_progress(tiny_llama_dir: Path) -> None:
    engine = make_engine(tiny_llama_dir, max_num_batched_tokens=64)
    request = engine.make_request("p", _prompt(200, 31), SamplingParams(temperature=0.0, max_tokens=2))
    outputs = engine.generate([request])["p"]
    progress = [o.num_computed_tokens for o in outputs if not o.new_token_ids and not o.finished]
    assert progress == [64, 128, 192]  # one per chunk before the last, which samples
    assert sum(len(o.new_token_ids) for o in outputs) == 2


def test_out_of_vocabulary_ids_are_rejected_before_queueing(engine: EngineCore) -> None:
    import pytest

    with pytest.raises(ValueError, match="token ids"):
        engine.make_request("oov", [1, 2, VOCAB], GREEDY)
    with pytest.raises(ValueError, match="token ids"):
        engine.make_request("bias", [1, 2], SamplingParams(logit_bias=((VOCAB + 5, 1.0),)))


def test_a_dense_cpu_engine_wraps_its_projections_and_head(engine: EngineCore) -> None:
    """make_engine's dense fp32 engine: every decoder projection a DenseRowsLinear under its old name,
    the LM head a DenseRowsHead over the tied embedding, and mixed steps split (model_runner)."""
    from torch import nn

    from kvserve.models.layers.quant import DenseRowsHead, DenseRowsLinear

    model = engine.runner.model
    projections = [m for m in model.model.modules() if isinstance(m, nn.Linear)]
    assert projections and all(type(m) is DenseRowsLinear for m in projections)
    assert isinstance(model.head_quant, DenseRowsHead)
    assert model.head_quant.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert engine.runner.split_mixed_steps
