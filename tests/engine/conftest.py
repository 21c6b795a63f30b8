"""A real EngineCore over a tiny random-weight llama (HF transformers is the oracle)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvserve.config import CacheConfig, EngineConfig, KVStoreConfig, SchedulerConfig
from kvserve.engine.core import EngineCore
from kvserve.engine.disk_tier_open import open_kv_tier
from kvserve.engine.kv_tier import OpenKVTier
from kvserve.models.loaded import LoadedModel, TokenizerInfo
from kvserve.models.loader.safetensors import load_hf_model
from kvserve.models.rope_scaling import ContextRequest
from tests.models.helpers import make_tiny_hf_model

VOCAB = 384
CTX = 2048


def save_tiny_llama(path: Path, max_position_embeddings: int = CTX, seed: int = 3) -> Path:
    model = make_tiny_hf_model("llama_tied", seed=seed)
    model.config.max_position_embeddings = max_position_embeddings
    model.save_pretrained(path, safe_serialization=True)
    return path


def load_hf_oracle(path: Path):  # -> transformers model
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def hf_tiny_llama(tiny_llama_dir: Path):  # -> transformers model, the oracle
    return load_hf_oracle(tiny_llama_dir)


def load_tiny(
    path: Path, dtype: torch.dtype = torch.float32, context: ContextRequest | None = None
) -> LoadedModel:
    hf = load_hf_model(path, dtype, context=context)
    # No tokenizer: engine tests speak token ids; eos is off so lengths are deterministic.
    tokenizer = TokenizerInfo(None, None, bos_token_id=None, eos_token_ids=(), add_bos_token=False)
    ctx = context.max_model_len if context is not None and context.max_model_len else CTX
    return LoadedModel(hf.model, hf.arch, tokenizer, hf.fingerprint, path, dtype, ctx)


def make_engine(
    path: Path,
    *,
    block_size: int = 16,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 256,
    kv_cache_memory_mb: int = 0,
    kv_store: KVStoreConfig | None = None,
    async_scheduling: bool | None = None,
    context: ContextRequest | None = None,
    weight_quant: str = "none",
    kv_dtype: str = "auto",  # auto: float16 under this fp32 engine (config.resolve)
    open_tier: OpenKVTier = open_kv_tier,
) -> EngineCore:
    config = EngineConfig(
        model=str(path),
        dtype="float32",
        device="cpu",
        cache=CacheConfig(block_size=block_size, kv_cache_memory_mb=kv_cache_memory_mb, kv_dtype=kv_dtype),  # type: ignore[arg-type]
        scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens),
        kv_store=kv_store,
        async_scheduling=async_scheduling,
        weight_quant=weight_quant,
    )
    return EngineCore(config, load_tiny(path, context=context), open_tier=open_tier)


@pytest.fixture()
def engine(tiny_llama_dir: Path) -> EngineCore:
    return make_engine(tiny_llama_dir)
