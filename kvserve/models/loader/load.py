"""`load_model`: a GGUF file, an HF safetensors folder or an alias into a `LoadedModel`. GGUF tensors
are translated to HF names first, so both formats meet the family modules through the same
`load_state_dict_into`. (Imported lazily by the package: it brings in torch and the model families.)
"""

from __future__ import annotations

import itertools
import json
import logging
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

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
from kvserve.models.loader.gguf_reader import GGUFFile
from kvserve.models.loader.mmproj import (
    MMPROJ_AUTO,
    MMPROJ_NONE,
    ImageProcessorConfig,
    Mmproj,
    find_mmproj,
    iter_mmproj_tensors,
    read_mmproj,
)
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
    mmproj: str | Path | None = None,
) -> LoadedModel:
    """Load a .gguf file, an HF folder (config.json + *.safetensors + tokenizer files) or an alias;
    with a tensor-parallel `tp`, only this rank's shard of the weights (`fingerprint` is the shard's).
    `context` (--ctx and the RoPE scaling flags) picks the context and the RoPE scaling the model is
    built with; `max_model_len` of the result is that context. `mmproj` (GGUF only): llama.cpp's
    vision projector file to load with the language model, "auto" for the one `mmproj*.gguf` beside
    it, or None / "none"; the pair is then the vision family its projector type names (Idefics3 or
    Qwen2.5-VL, `loader/mmproj.py`).

    Raises a `ModelLoadError` subclass, with a one-line message naming the file, for a missing
    path, a corrupt file or an architecture kvserve cannot run, and `ContextError` for a context
    the flags cannot give this model.
    """
    path = resolve_model_path(spec)
    if path.is_dir():
        if mmproj is not None and str(mmproj) not in (MMPROJ_AUTO, MMPROJ_NONE):
            raise UnsupportedModelError(
                path, "--mmproj goes with a GGUF language model; a folder has its own"
            )
        hf_config = _read_config_json(path)
        plan = _plan(path, hf_config, context, tp)
        model = _build(path, plan.arch, dtype, device, tp)
        _load_weights(path, model, _with_progress(_safetensors(path), path, progress))
        return _loaded(path, model, plan, load_hf_tokenizer(path), dtype)
    gguf = read_gguf(path)
    if gguf.architecture == "clip":
        raise UnsupportedModelError(
            path, "a vision projector (mmproj): pass the language GGUF as --model, this as --mmproj"
        )
    hf_config = hf_config_from_gguf(gguf)
    # Before the weights: fail fast on a bad vocabulary (and the projector needs its image token).
    tokenizer = load_gguf_tokenizer(path, gguf.metadata)
    mmproj_path = find_mmproj(path, mmproj)
    try:
        projector = _read_mmproj(gguf, hf_config, tokenizer, mmproj_path)
    except UnsupportedModelError as error:
        if str(mmproj) != MMPROJ_AUTO:
            raise
        # Found, not asked for: a projector of a kind kvserve cannot run (another family's mmproj
        # in a download folder) leaves the text model serving, as before the pick-up existed.
        logger.warning("%s; serving the text model without images (--mmproj FILE to insist)", error)
        projector = None
    model_config = hf_config if projector is None else projector.config
    plan = _plan(path, model_config, context, tp)
    model = _build(path, plan.arch, dtype, device, tp)
    _load_weights(path, model, _gguf_tensors(gguf, projector, hf_config, dtype, progress))
    processor = None if projector is None else projector.mmproj.processor
    return _loaded(path, model, plan, tokenizer, dtype, file_weight_quant(gguf), processor)


class _Projector(NamedTuple):
    mmproj: Mmproj
    config: dict  # the pair's HF config (Idefics3's, Qwen2.5-VL's)


def _read_mmproj(
    gguf: GGUFFile, text_config: dict, tokenizer: TokenizerInfo, mmproj_path: Path | None
) -> _Projector | None:
    if mmproj_path is None:
        return None
    mmproj = read_mmproj(mmproj_path, int(text_config["hidden_size"]))  # its projector type first
    projector = mmproj.format
    if gguf.architecture != projector.language_architecture:
        raise UnsupportedModelError(
            mmproj_path,
            f"a {projector.projector_type} projector goes with a {projector.language_architecture} "
            f"language model, not {gguf.path.name}'s {gguf.architecture}",
        )
    logger.info("vision projector %s: %s", mmproj_path.name, mmproj.header.summary)
    vocab = tokenizer.tokenizer.get_vocab()
    token_ids = {}
    for key, token in projector.token_keys:
        if token not in vocab:
            raise UnsupportedModelError(
                gguf.path, f"no {token} token in its vocabulary for the images of {mmproj_path}"
            )
        token_ids[key] = vocab[token]
    return _Projector(mmproj, projector.hf_config(gguf, text_config, mmproj.header, token_ids))


def _gguf_tensors(
    gguf: GGUFFile, projector: _Projector | None, hf_config: dict, dtype: torch.dtype, progress: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    tensors = iter_hf_tensors(gguf, hf_config, dtype, progress=progress)
    return (
        tensors
        if projector is None
        else itertools.chain(tensors, iter_mmproj_tensors(projector.mmproj, dtype))
    )


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
    image_processor: ImageProcessorConfig | None = None,
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
        image_processor=image_processor,
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
