"""Load a Hugging Face folder (config.json + *.safetensors, sharded or not) into a family module.

`load_state_dict_into` is the one place HF tensor names meet module parameters; the GGUF
loader reuses it after translating GGUF tensors to HF names and layouts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import safe_open
from torch import nn

from kvserve.distributed.layers import LoadsFullWeights
from kvserve.models.config import ModelArchConfig, arch_config_from_hf
from kvserve.models.fingerprint import model_fingerprint
from kvserve.models.layers.attention.backend import AttentionBackend
from kvserve.models.layers.linear import MergedLinear
from kvserve.models.registry import build_model
from kvserve.models.rope_scaling import ContextRequest, plan_context


class WeightLoadError(RuntimeError):
    """The checkpoint's tensors do not fit the module (unknown, missing or mis-shaped)."""


class HFModel(NamedTuple):
    model: nn.Module  # a CausalLMBase subclass
    arch: ModelArchConfig
    fingerprint: str


def load_hf_config(path: Path) -> ModelArchConfig:
    return arch_config_from_hf(json.loads((Path(path) / "config.json").read_text()))


def iter_safetensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) for every tensor of every *.safetensors file in the folder."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118  # safetensors 0.8 handles are not iterable
                yield name, f.get_tensor(name)


def load_hf_model(
    path: Path | str,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    backend: AttentionBackend | None = None,
    context: ContextRequest | None = None,
) -> HFModel:
    """The bare model of an HF folder (no tokenizer); `context` as in `load_model`."""
    path = Path(path)
    arch = plan_context(load_hf_config(path), context or ContextRequest()).arch
    model = build_model(arch, dtype, device, backend)
    load_state_dict_into(model, iter_safetensors(path))
    return HFModel(model, arch, model_fingerprint(arch, dtype, model.state_dict().items()))


@torch.no_grad()
def load_state_dict_into(model: nn.Module, hf_named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy HF-named tensors into `model` (casting to its dtype/device), routing q/k/v and
    gate/up into the fused projections. Raises WeightLoadError on an unknown name, a shape
    mismatch, or any parameter (or fused shard) left unloaded."""
    params = dict(model.named_parameters())
    loaded: set[tuple[str, int | None]] = set()
    for hf_name, tensor in hf_named_tensors:
        target = model.map_hf_name(hf_name)
        if target is None:
            continue
        name, shard = target
        if name not in params:
            model_name = type(model).__name__
            raise WeightLoadError(f"checkpoint tensor {hf_name!r} has no parameter {name!r} in {model_name}")
        module_name, _, param_name = name.rpartition(".")
        owner = model.get_submodule(module_name)
        try:
            if shard is not None:
                owner.load_shard(param_name, shard, tensor)
            elif isinstance(owner, LoadsFullWeights):  # a tensor-parallel rank keeps its slice
                owner.load_weight(param_name, tensor)
            elif params[name].shape != tensor.shape:
                expected = tuple(params[name].shape)
                raise WeightLoadError(f"{hf_name}: expected {expected}, got {tuple(tensor.shape)}")
            else:
                params[name].copy_(tensor)
        except ValueError as e:
            raise WeightLoadError(f"{hf_name}: {e}") from e
        loaded.add((name, shard))
    missing = _expected_slots(model) - loaded
    if missing:
        names = sorted(f"{n}[shard {s}]" if s is not None else n for n, s in missing)
        raise WeightLoadError(f"{len(missing)} parameters not in the checkpoint, e.g. {names[:5]}")


def _expected_slots(model: nn.Module) -> set[tuple[str, int | None]]:
    slots: set[tuple[str, int | None]] = set()
    for module_name, module in model.named_modules():
        for param_name, _ in module.named_parameters(recurse=False):
            full = f"{module_name}.{param_name}" if module_name else param_name
            if isinstance(module, MergedLinear):
                slots.update((full, shard) for shard in range(len(module.out_sizes)))
            else:
                slots.add((full, None))
    return slots
