"""Tensor parallelism on CPU: 2 gloo ranks (this process + one spawned) against TP=1.

fp32, so that greedy tokens can be compared exactly: a sharded matmul sums in a different order
than the full one (row-parallel partial sums, then the all-reduce), which in bf16 moves logits
by ~1e-2 and can flip a near-tie argmax; in fp32 the drift is ~1e-6.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kvserve.config import CacheConfig, EngineConfig, KVStoreConfig, SchedulerConfig
from kvserve.engine.core import EngineCore
from kvserve.engine.sampling_params import SamplingParams
from kvserve.engine.tensor_parallel.launch import start_tp_engine
from tests.engine.conftest import CTX, VOCAB, load_tiny
from tests.engine.tp_loaders import fail_on_rank_1, load_tiny_shard
from tests.models.helpers import save_tiny_hf_model, tiny_hf_config

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
MQA_VOCAB = 383
SEEDED = SamplingParams(temperature=0.8, seed=3, max_tokens=12, ignore_eos=True)


def _config(path: Path, tp: int, kv_store: KVStoreConfig | None = None) -> EngineConfig:
    return EngineConfig(
        model=str(path),
        dtype="float32",
        device="cpu",
        tensor_parallel_size=tp,
        cache=CacheConfig(block_size=16),
        # 32-token steps: the longer prompts prefill in chunks beside the others' decodes.
        scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32),
        kv_store=kv_store,
    )


@contextmanager
def _engine(path: Path, tp: int, kv_store: KVStoreConfig | None = None) -> Iterator[EngineCore]:
    config = _config(path, tp, kv_store)
    if tp == 1:
        engine = EngineCore(config, load_tiny(path))
    else:
        engine = start_tp_engine(config, functools.partial(load_tiny_shard, max_model_len=CTX))
    try:
        yield engine
    finally:
        engine.shutdown()


def _prompt(n: int, seed: int, vocab_size: int = VOCAB) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab_size) for _ in range(n)]


def _generate(
    engine: EngineCore, prompts: list[list[int]], params: list[SamplingParams]
) -> dict[str, list[int]]:
    requests = [
        engine.make_request(f"r{i}", p, sp) for i, (p, sp) in enumerate(zip(prompts, params, strict=True))
    ]
    results = engine.generate(requests)
    return {rid: [t for o in outputs for t in o.new_token_ids] for rid, outputs in results.items()}


@pytest.fixture(scope="module")
def tiny_qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-qwen3")
    save_tiny_hf_model("qwen3", path, seed=5)  # untied LM head, q/k norms
    return path


@pytest.fixture(scope="module")
def tiny_mqa_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One KV head for 4 query heads: at TP=2 both ranks hold a replica of it. An odd vocabulary
    (383): the second rank's vocabulary shard is padded, and the gathered logits are cut back."""
    import torch
    import transformers

    path = tmp_path_factory.mktemp("tiny-qwen3-mqa")
    config = tiny_hf_config("qwen3")
    config.num_key_value_heads, config.initializer_range, config.vocab_size = 1, 0.1, MQA_VOCAB
    torch.manual_seed(6)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    return path


def test_tp2_gives_the_tp1_tokens_on_a_tiny_qwen3(tiny_qwen3_dir: Path) -> None:
    prompts = [_prompt(7, 1), _prompt(45, 2), _prompt(90, 3), _prompt(20, 4)]
    params = [GREEDY, GREEDY, GREEDY, SEEDED]
    with _engine(tiny_qwen3_dir, tp=1) as engine:
        expected = _generate(engine, prompts, params)
    with _engine(tiny_qwen3_dir, tp=2) as engine:
        model = engine.loaded.model  # rank 0 holds only its shard
        assert model.model.embed_tokens.weight.shape[0] == VOCAB // 2
        assert model.lm_head.weight.shape[0] == VOCAB // 2
        assert engine.runner.local.kv_caches[0].shape[-2] == 1  # 1 of the 2 KV heads
        assert _generate(engine, prompts, params) == expected
    assert len(set(map(tuple, expected.values()))) == len(prompts)  # distinct outputs: the test can fail


def test_a_tp2_disk_checkpoint_reloads_at_tp2_and_is_not_used_at_tp1(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    store = KVStoreConfig(directory=str(tmp_path / "kv"), preload_fraction=0.0)  # the request's disk load
    base = _prompt(1200, 1)
    follow_up = base + _prompt(40, 2)
    with _engine(tiny_llama_dir, tp=1) as engine:  # tied embeddings: the LM head is the embedding shard
        cold = _generate(engine, [follow_up], [GREEDY])
    with _engine(tiny_llama_dir, tp=2, kv_store=store) as engine:
        _generate(engine, [base], [GREEDY])  # a cold checkpoint; each rank's KV heads gathered to rank 0
    with _engine(tiny_llama_dir, tp=2, kv_store=store) as engine:
        request = engine.make_request("r0", follow_up, GREEDY)
        outputs = engine.generate([request])["r0"]
        assert engine.disk_tier is not None and engine.disk_tier.stats().num_hits == 1
        assert request.num_cached_tokens >= 1200 // 16 * 16  # loaded and scattered back to both ranks
        assert [t for o in outputs for t in o.new_token_ids] == cold["r0"]
    with _engine(tiny_llama_dir, tp=1, kv_store=store) as engine:  # another identity: its own subdirectory
        assert engine.disk_tier is not None and engine.disk_tier.stats().num_checkpoints == 0
        request = engine.make_request("r0", follow_up, GREEDY)
        assert [t for o in engine.generate([request])["r0"] for t in o.new_token_ids] == cold["r0"]
        assert request.num_cached_tokens == 0


def test_a_rank_that_fails_to_load_fails_the_start_instead_of_hanging(tiny_qwen3_dir: Path) -> None:
    with pytest.raises(RuntimeError, match="closed by peer"):  # gloo: the dead rank's connections
        start_tp_engine(_config(tiny_qwen3_dir, tp=2), functools.partial(fail_on_rank_1, max_model_len=CTX))
    with _engine(tiny_qwen3_dir, tp=1) as engine:  # the group is gone: this process serves on
        assert _generate(engine, [_prompt(5, 0)], [GREEDY])["r0"]


def test_tp2_replicates_a_single_kv_head_and_gives_the_tp1_tokens(tiny_mqa_dir: Path) -> None:
    prompts = [_prompt(9, 7, MQA_VOCAB), _prompt(50, 8, MQA_VOCAB)]
    with _engine(tiny_mqa_dir, tp=1) as engine:
        expected = _generate(engine, prompts, [GREEDY, GREEDY])
    with _engine(tiny_mqa_dir, tp=2) as engine:
        assert engine.runner.local.kv_caches[0].shape[-2] == 1  # the one KV head, on each rank
        assert engine.loaded.model.model.layers[0].self_attn.num_heads == 2
        embedding = engine.loaded.model.model.embed_tokens
        assert embedding.weight.shape[0] == 192  # ceil(383 / 2) rows a rank; rank 1 pads one
        assert _generate(engine, prompts, [GREEDY, GREEDY]) == expected
