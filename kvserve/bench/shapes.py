"""Named model shapes with random weights, for GPU benchmarks that need no download.

The HF transformers model is built first (its random init is the weight source) and its
state dict is loaded into ours, so both engines run the same weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kvserve.config import EngineConfig
from kvserve.distributed.group import TPGroup
from kvserve.models import registry
from kvserve.models.config import arch_config_from_hf
from kvserve.models.loaded import LoadedModel, TokenizerInfo
from kvserve.models.loader.safetensors import load_state_dict_into

_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0}

SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.2-1b": {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {**_LLAMA3_ROPE, "factor": 32.0, "original_max_position_embeddings": 8192},
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
    },
    "llama-3.1-8b": {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {**_LLAMA3_ROPE, "factor": 8.0, "original_max_position_embeddings": 8192},
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
    },
}


def build_hf_model(shape: str, dtype: torch.dtype, device: str, seed: int = 0) -> torch.nn.Module:
    """transformers' model of `shape` with its own random init (std 0.02), on `device`."""
    import transformers

    config = transformers.LlamaConfig(**{k: v for k, v in SHAPES[shape].items() if k != "model_type"})
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # works across transformers versions (dtype= vs torch_dtype=)
    try:
        with torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_dtype(previous)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval().requires_grad_(False)


def random_loaded_model(
    shape: str, hf_model: torch.nn.Module, dtype: torch.dtype, device: str, tp: TPGroup | None = None
) -> LoadedModel:
    """Our module of `shape` holding a copy of `hf_model`'s weights (this rank's shard of them with
    a tensor-parallel `tp`); no tokenizer (ids only)."""
    arch = arch_config_from_hf(SHAPES[shape])
    model = registry.build_model(arch, dtype, device, tp=tp)
    load_state_dict_into(model, hf_model.state_dict().items())
    tokenizer = TokenizerInfo(None, None, bos_token_id=None, eos_token_ids=(), add_bos_token=False)
    return LoadedModel(
        model=model,
        arch=arch,
        tokenizer=tokenizer,
        fingerprint=f"random-{shape}",
        path=Path(f"random-{shape}"),
        dtype=dtype,
        max_model_len=arch.max_position_embeddings,
    )


def load_random_shard(group: TPGroup, config: EngineConfig, *, shape: str) -> LoadedModel:
    """A ShardLoader for tensor-parallel benchmarks: every rank builds the same seeded HF model on
    its own GPU (the weight source, as at TP=1) and keeps its shard of it."""
    hf = build_hf_model(shape, config.torch_dtype, config.device, seed=config.seed)
    loaded = random_loaded_model(shape, hf, config.torch_dtype, config.device, tp=group)
    del hf
    if config.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return loaded


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())
