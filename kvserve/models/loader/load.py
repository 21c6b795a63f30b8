"""`load_model`: a GGUF file, an HF safetensors folder or an alias into a `LoadedModel`. GGUF tensors
are translated to HF names first, so both formats meet the family modules through the same
`load_state_dict_into`. (Imported lazily by the package: it brings in torch and the model families.)
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError
from torch import nn
from tqdm import tqdm

from kvserve.distributed.group import TPGroup
from kvserve.models import registry
from kvserve.models.config import ModelArchConfig, arch_config_from_hf
from kvserve.models.errors import CorruptModelFileError, ModelNotFoundError, UnsupportedModelError
from kvserve.models.fingerprint import model_fingerprint
from kvserve.models.loaded import LoadedModel, TokenizerInfo
from kvserve.models.loader.gguf import file_weight_quant, hf_config_from_gguf, iter_hf_tensors, read_gguf
from kvserve.models.loader.paths import resolve_model_path
from kvserve.models.loader.safetensors import WeightLoadError, iter_safetensors, load_state_dict_into
from kvserve.models.loader.tokenizer import load_gguf_tokenizer, load_hf_tokenizer
from kvserve.models.rope_scaling import ContextPlan, ContextRequest, describe, plan_context

logger = logging.getLogger(__name__)


def load_model(
    spec: str | Path,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    *,
    progress: bool = True,
    tp: TPGroup | None = None,
    context: ContextRequest | None = None,
) -> LoadedModel:
    """Load a .gguf file, an HF folder (config.json + *.safetensors + tokenizer files) or an alias;
    with a tensor-parallel `tp`, only this rank's shard of the weights (`fingerprint` is the shard's).
    `context` (--ctx and the RoPE scaling flags) picks the context and the RoPE scaling the model is
    built with; `max_model_len` of the result is that context.

    Raises a `ModelLoadError` subclass, with a one-line message naming the file, for a missing
    path, a corrupt file or an architecture kvserve cannot run, and `ContextError` for a context
    the flags cannot give this model.
    """
    path = resolve_model_path(spec)
    file_quant = None
    if path.is_dir():
        hf_config = _read_config_json(path)
        plan = _plan(path, hf_config, context, tp)
        model = _build(path, plan.arch, dtype, device, tp)
        _load_weights(path, model, _with_progress(_safetensors(path), path, progress))
        tokenizer = load_hf_tokenizer(path)
    else:
        gguf = read_gguf(path)
        hf_config = hf_config_from_gguf(gguf)
        plan = _plan(path, hf_config, context, tp)
        tokenizer = load_gguf_tokenizer(
            path, gguf.metadata
        )  # before the weights: fail fast on a bad vocabulary
        model = _build(path, plan.arch, dtype, device, tp)
        _load_weights(path, model, iter_hf_tensors(gguf, hf_config, dtype, progress=progress))
        file_quant = file_weight_quant(gguf)
    return _loaded(path, model, plan, tokenizer, dtype, file_quant)


def _plan(path: Path, hf_config: dict, context: ContextRequest | None, tp: TPGroup | None) -> ContextPlan:
    plan = plan_context(_arch_config(path, hf_config), context or ContextRequest())
    if tp is None or tp.is_driver:  # one log line per server, not per rank
        if plan.notice is not None:
            logger.warning("%s", plan.notice)
        logger.info("context %d, %s", plan.max_model_len, describe(plan.arch))
    return plan


def _loaded(
    path: Path,
    model: nn.Module,
    plan: ContextPlan,
    tokenizer: TokenizerInfo,
    dtype: torch.dtype,
    file_quant: str | None = None,
) -> LoadedModel:
    return LoadedModel(
        model=model,
        arch=plan.arch,
        tokenizer=tokenizer,
        # The arch carries the RoPE scaling: KV under other scaling gets another fingerprint.
        fingerprint=model_fingerprint(plan.arch, dtype, model.state_dict().items()),
        path=path,
        dtype=dtype,
        max_model_len=plan.max_model_len,
        file_weight_quant=file_quant,
    )


def _read_config_json(folder: Path) -> dict:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CorruptModelFileError(folder / "config.json", f"invalid JSON ({error})") from None
    if not isinstance(config, dict):
        raise CorruptModelFileError(folder / "config.json", "expected a JSON object")
    return config


def _arch_config(path: Path, hf_config: dict) -> ModelArchConfig:
    try:
        return arch_config_from_hf(hf_config)
    except (KeyError, TypeError, ValueError) as error:
        raise CorruptModelFileError(
            path, f"incomplete model config ({type(error).__name__}: {error})"
        ) from None


def _build(
    path: Path, arch: ModelArchConfig, dtype: torch.dtype, device: torch.device | str, tp: TPGroup | None
) -> nn.Module:
    try:
        return registry.build_model(arch, dtype, device, tp=tp)
    except (registry.UnsupportedModelError, ValueError) as error:  # ValueError: cannot be sharded
        raise UnsupportedModelError(path, str(error)) from None


def _load_weights(path: Path, model: nn.Module, hf_named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    try:
        load_state_dict_into(model, hf_named_tensors)
    except WeightLoadError as error:
        raise CorruptModelFileError(path, f"weights do not match the model config: {error}") from None


def _safetensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    try:
        yield from iter_safetensors(folder)
    except FileNotFoundError:
        raise ModelNotFoundError(folder, "no *.safetensors files") from None
    except SafetensorError as error:
        raise CorruptModelFileError(folder, f"unreadable safetensors file ({error})") from None


def _with_progress(
    tensors: Iterator[tuple[str, torch.Tensor]], path: Path, enabled: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    yield from tqdm(tensors, desc=f"Loading {path.name}", unit="tensor", file=sys.stderr, disable=not enabled)
