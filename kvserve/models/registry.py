"""Architecture name (ModelArchConfig.architecture, the HF model_type) -> family module.

Imports are lazy so that listing or rejecting a model does not import every family.
"""

from __future__ import annotations

import importlib

import torch
from torch import nn

from kvserve.distributed.group import TPGroup
from kvserve.models.config import ModelArchConfig
from kvserve.models.layers.attention.backend import AttentionBackend

_FAMILIES: dict[str, tuple[str, str]] = {
    "llama": ("kvserve.models.llama", "LlamaForCausalLM"),
    "qwen2": ("kvserve.models.qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("kvserve.models.qwen3", "Qwen3ForCausalLM"),
    "gemma3": ("kvserve.models.gemma3", "Gemma3ForCausalLM"),
    "idefics3": ("kvserve.models.idefics3", "Idefics3ForConditionalGeneration"),
    "qwen2_5_vl": ("kvserve.models.qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"),
}


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture has no family module here."""


def supported_architectures() -> tuple[str, ...]:
    return tuple(_FAMILIES)


def get_model_class(architecture: str) -> type[nn.Module]:
    if architecture not in _FAMILIES:
        raise UnsupportedModelError(
            f"unsupported model architecture {architecture!r}; supported: {', '.join(_FAMILIES)} "
            "(Mistral loads as llama, gemma3_text as gemma3)"
        )
    module_name, class_name = _FAMILIES[architecture]
    return getattr(importlib.import_module(module_name), class_name)


def build_model(
    arch: ModelArchConfig,
    dtype: torch.dtype,
    device: torch.device | str,
    backend: AttentionBackend | None = None,
    tp: TPGroup | None = None,
) -> nn.Module:
    """An uninitialized family module on `device` in `dtype`, ready for `load_state_dict_into`.

    Built on the meta device so no time is spent on random init; every parameter must
    then be loaded (the loader checks), and non-persistent buffers are recomputed here.
    With a tensor-parallel `tp`, only this rank's shard is ever allocated.
    """
    if backend is None:
        from kvserve.models.layers.attention.torch_ref import TorchRefBackend

        backend = TorchRefBackend()
    cls = get_model_class(arch.architecture)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = cls(arch, backend)
            if tp is not None and tp.is_parallel:
                from kvserve.distributed.sharding import shard_model

                shard_model(model, tp)
    finally:
        torch.set_default_dtype(previous)
    model.to_empty(device=device)
    model.reset_buffers()
    return model.eval().requires_grad_(False)
