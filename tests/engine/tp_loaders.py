"""Shard loaders for tensor-parallel engine tests: module-level, so spawned ranks can unpickle them."""

from __future__ import annotations

from pathlib import Path

from kvserve.config import EngineConfig
from kvserve.distributed.group import TPGroup
from kvserve.models.fingerprint import model_fingerprint
from kvserve.models.loaded import LoadedModel, TokenizerInfo
from kvserve.models.loader.safetensors import iter_safetensors, load_hf_config, load_state_dict_into
from kvserve.models.registry import build_model


def load_tiny_shard(group: TPGroup, config: EngineConfig, *, max_model_len: int) -> LoadedModel:
    """This rank's shard of a tiny HF folder; no tokenizer (token-id engines), eos off."""
    path = Path(config.model)
    arch = load_hf_config(path)
    model = build_model(arch, config.torch_dtype, config.device, tp=group)
    load_state_dict_into(model, iter_safetensors(path))
    fingerprint = model_fingerprint(arch, config.torch_dtype, model.state_dict().items())
    tokenizer = TokenizerInfo(None, None, bos_token_id=None, eos_token_ids=(), add_bos_token=False)
    return LoadedModel(model, arch, tokenizer, fingerprint, path, config.torch_dtype, max_model_len)


def fail_on_rank_1(group: TPGroup, config: EngineConfig, *, max_model_len: int) -> LoadedModel:
    """Rank 1 cannot load its shard (as with a missing file on one rank)."""
    if group.rank == 1:
        raise FileNotFoundError("rank 1 has no weights")
    return load_tiny_shard(group, config, max_model_len=max_model_len)
