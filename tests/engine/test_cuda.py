"""The engine on CUDA (skipped on CPU): CUDA-graph decode against eager decode, the Triton
backend against the torch reference backend, and KV sizing from free GPU memory."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from kvserve.config import CacheConfig, EngineConfig, SchedulerConfig
from kvserve.engine.core import EngineCore
from kvserve.engine.sampling_params import SamplingParams
from kvserve.models.loaded import LoadedModel, TokenizerInfo
from kvserve.models.loader.safetensors import load_hf_model
from kvserve.models.rope_scaling import ContextRequest
from tests.engine.conftest import CTX, VOCAB
from tests.models.helpers import PagedDriver

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _loaded(path: Path, dtype: str, context: ContextRequest | None = None) -> LoadedModel:
    hf = load_hf_model(path, _DTYPES[dtype], "cuda", context=context)
    tokenizer = TokenizerInfo(None, None, bos_token_id=None, eos_token_ids=(), add_bos_token=False)
    ctx = context.max_model_len if context is not None else CTX
    return LoadedModel(hf.model, hf.arch, tokenizer, hf.fingerprint, path, _DTYPES[dtype], ctx)


def _engine(
    path: Path,
    dtype: str,
    *,
    backend: str = "auto",
    eager: bool = False,
    max_num_batched_tokens: int = 256,
    kv_cache_memory_mb: int = 64,
    gpu_memory_utilization: float = 0.9,
    async_scheduling: bool | None = None,
    context: ContextRequest | None = None,
) -> EngineCore:
    config = EngineConfig(
        model=str(path),
        dtype=dtype,
        device="cuda",
        attention_backend=backend,
        enforce_eager=eager,
        async_scheduling=async_scheduling,
        cache=CacheConfig(
            block_size=16,
            kv_cache_memory_mb=kv_cache_memory_mb,
            gpu_memory_utilization=gpu_memory_utilization,
        ),
        scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=max_num_batched_tokens),
    )
    return EngineCore(config, _loaded(path, dtype, context))


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


def _generate(engine: EngineCore, prompts: list[list[int]], tag: str = "r") -> list[list[int]]:
    # Different lengths, so the decode batch shrinks through sizes that need padding (7, 5, 3).
    requests = [
        engine.make_request(
            f"{tag}{i}", p, SamplingParams(temperature=0.0, max_tokens=8 + 5 * i, ignore_eos=True)
        )
        for i, p in enumerate(prompts)
    ]
    outputs = engine.generate(requests)
    return [[t for o in outputs[r.request_id] for t in o.new_token_ids] for r in requests]


PROMPTS = [_prompt(n, seed) for seed, n in enumerate([5, 17, 40, 64, 100, 130, 300, 33])]


@pytest.mark.parametrize("upload", ["one_copy", "compact"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graph_decode_equals_eager(
    tiny_llama_dir: Path, dtype: str, upload: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvserve.engine.runner import cuda_graphs

    if upload == "compact":  # the many-streams upload: compact tables scattered on the device
        monkeypatch.setattr(cuda_graphs, "_FULL_ROWS_BYTES", 0)
    graphed = _engine(tiny_llama_dir, dtype)
    assert graphed.runner.graphs is not None and graphed.runner.attention_backend == "triton"
    got = _generate(graphed, PROMPTS)
    assert graphed.runner.graphs.num_replays > 0
    want = _generate(_engine(tiny_llama_dir, dtype, eager=True), PROMPTS)
    assert got == want


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_overlapped_graph_decode_equals_synchronous(tiny_llama_dir: Path, dtype: str) -> None:
    # Stop tokens end rows 0 and 3 mid-batch, so later launches gather the survivors' ids on the device.
    probe = _generate(_engine(tiny_llama_dir, dtype, async_scheduling=False), PROMPTS)
    stops = {0: probe[0][4], 3: probe[3][9]}
    runs = []
    for async_scheduling in (True, False):
        engine = _engine(tiny_llama_dir, dtype, async_scheduling=async_scheduling)
        assert engine.async_scheduling is async_scheduling
        requests = [
            engine.make_request(
                f"o{i}",
                p,
                SamplingParams(
                    temperature=0.0,
                    max_tokens=8 + 5 * i,
                    ignore_eos=True,
                    stop_token_ids=(stops[i],) if i in stops else (),
                ),
            )
            for i, p in enumerate(PROMPTS)
        ]
        outputs = engine.generate(requests)
        runs.append([[t for o in outputs[r.request_id] for t in o.new_token_ids] for r in requests])
        assert engine.kv_manager.num_free_blocks == engine.kv_manager.num_usable_blocks
    assert runs[0] == runs[1]
    assert runs[0][0][-1] == stops[0] and runs[0][3][-1] == stops[3]


def test_yarn_graph_decode_equals_the_cpu_engine(tiny_llama_dir: Path) -> None:
    """--ctx 4x the trained context on CUDA: the fused RoPE tables, the fused RoPE + KV write and the
    CUDA-graph decode carry YaRN's attention factor as the CPU torch path does."""
    from tests.engine.conftest import make_engine

    yarn = ContextRequest(4 * CTX, "yarn")  # static: these short prompts would run unscaled on demand
    graphed = _engine(tiny_llama_dir, "float32", context=yarn)
    assert graphed.loaded.arch.rope_scaling_dict["rope_type"] == "yarn" and graphed.runner.graphs is not None
    got = _generate(graphed, PROMPTS)
    assert graphed.runner.graphs.num_replays > 0
    assert got == _generate(make_engine(tiny_llama_dir, context=yarn), PROMPTS)
    assert got != _generate(_engine(tiny_llama_dir, "float32"), PROMPTS)  # the scaling matters


def test_on_demand_yarn_graph_decode_runs_each_request_in_its_regime(tiny_llama_dir: Path) -> None:
    """--ctx 2x, YaRN on demand: short and long requests share CUDA-graph decode steps, each row's
    regime riding in its positions; the tokens are the CPU engine's, the long ones a static engine's."""
    from tests.engine.conftest import make_engine

    on_demand, static = ContextRequest(max_model_len=2 * CTX), ContextRequest(2 * CTX, "yarn")
    prompts = PROMPTS[:4] + [_prompt(2040, 8), _prompt(2100, 9)]  # the last two scaled (> 2048)
    graphed = _engine(tiny_llama_dir, "float32", context=on_demand)
    assert graphed.scheduler.rope is not None and graphed.runner.graphs is not None
    got = _generate(graphed, prompts)
    assert graphed.runner.graphs.num_replays > 0
    assert got == _generate(make_engine(tiny_llama_dir, context=on_demand, kv_dtype="float32"), prompts)
    scaled = _generate(_engine(tiny_llama_dir, "float32", context=static), prompts)
    assert got[4:] == scaled[4:] and got[:4] != scaled[:4]


def test_seeded_sampling_graph_equals_eager(tiny_llama_dir: Path) -> None:
    params = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=11, max_tokens=24, ignore_eos=True)
    runs = []
    for eager in (False, True):
        engine = _engine(tiny_llama_dir, "float32", eager=eager)
        requests = [engine.make_request(f"s{i}", p, params) for i, p in enumerate(PROMPTS[:4])]
        outputs = engine.generate(requests)
        runs.append([[t for o in outputs[r.request_id] for t in o.new_token_ids] for r in requests])
    assert runs[0] == runs[1]


def test_triton_equals_reference_fp32_chunked_and_prefix_cached(tiny_llama_dir: Path) -> None:
    prompts = PROMPTS + [PROMPTS[6][:200] + _prompt(60, 99)]  # shares 192 tokens (12 blocks) of 300
    results = []
    for backend in ("triton", "torch_ref"):
        engine = _engine(tiny_llama_dir, "float32", backend=backend, eager=True, max_num_batched_tokens=64)
        first = _generate(engine, prompts)
        again = _generate(engine, prompts, tag="again")  # every prompt now hits the prefix cache
        assert first == again
        results.append(first)
    assert results[0] == results[1]


def test_triton_logits_match_reference_bf16(tiny_llama_dir: Path) -> None:
    model = _loaded(tiny_llama_dir, "bfloat16").model
    steps = [
        [(0, _prompt(30, 1)), (1, _prompt(45, 2))],  # fresh prefills
        [(0, _prompt(20, 3))],  # a chunk over a cached prefix
    ] + [[(0, [7]), (1, [9])] for _ in range(6)]  # decodes
    logits = {}
    from kvserve.models.layers.attention.torch_ref import TorchRefBackend
    from kvserve.models.layers.attention.triton_backend import TritonBackend

    for backend in (TritonBackend(), TorchRefBackend()):
        model.set_attention_backend(backend)
        driver = PagedDriver(model, num_blocks=64, block_size=16)
        logits[backend.name] = [driver.step(chunks) for chunks in steps]
    for got, want in zip(logits["triton"], logits["torch_ref"]):
        scale = want.abs().max()
        assert (got - want).abs().max() <= 0.02 * scale, ((got - want).abs().max(), scale)
        assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9


def test_kv_pool_sized_from_free_memory(tiny_llama_dir: Path) -> None:
    engine = _engine(tiny_llama_dir, "bfloat16", kv_cache_memory_mb=0, gpu_memory_utilization=0.5)
    _free, total = torch.cuda.mem_get_info()
    kv_bytes = sum(c.numel() * c.element_size() for c in engine.runner.kv_caches)
    assert kv_bytes > 0.2 * total  # most of the half we asked for
    assert _generate(engine, PROMPTS[:2])
