"""Named model shapes with random weights, for GPU benchmarks that need no download.

The HF transformers model is built first (its random init is the weight source) and its
state dict is loaded into ours, so both engines run the same weights. The shapes themselves
(their HF configs) are in `shape_configs.py`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kvserve.bench.shape_configs import SHAPES
from kvserve.config import EngineConfig
from kvserve.distributed.group import TPGroup
from kvserve.models import registry
from kvserve.models.config import arch_config_from_hf
from kvserve.models.loaded import LoadedModel, TokenizerInfo
from kvserve.models.loader.safetensors import load_state_dict_into


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
