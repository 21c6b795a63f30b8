"""Sampling defaults: what a request that leaves a sampling parameter out gets.

Coding agents send no temperature (Claude Code, Codex), so the APIs' own default, temperature 1.0
over the whole vocabulary, is what a server without defaults samples at; a small model wanders at
it and never ends its turn. The ecosystem's answer, per parameter, highest first:

1. what the request sends (the adapters' `SamplingOptions`; not here);
2. `--override-generation-config` (vLLM's flag of that name);
3. the model's own recommendation: an HF folder's `generation_config.json` (vLLM's
   `--generation-config auto`), a GGUF's `general.sampling.*` keys (llama.cpp);
4. a preset kvserve ships for a model it installs (`models/aliases.py`: Ollama's per-model
   `params`), for files that carry no recommendation of their own;
5. llama.cpp's sampler chain defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05).

`--generation-config none` skips 3-5: the APIs' own neutral values, as vLLM's `vllm` mode.
Pure: reads JSON and GGUF metadata it is given, no torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

GENERATION_CONFIG_MODES = ("auto", "none")


@dataclass(frozen=True)
class SamplingDefaults:
    """One value per sampling parameter (the engine's neutral value where nothing sets one), and for
    each value that is set, where it came from."""

    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    # llama.cpp's penalty_last_n: the repetition penalty looks at the last N tokens of the
    # sequence (prompt and answer), 0 = all of them (HF's semantics, generation_config.json's).
    repetition_last_n: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # llama.cpp's DRY sampler (engine/dry.py; off at multiplier 0, as in llama.cpp): penalizes the
    # token that would extend a verbatim repeat within the answer, exponentially in its length.
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    # HF's exponential_decay_length_penalty (start, factor): past `start` generated tokens the
    # end-of-sequence logit grows by the factor each step, so an answer that runs on ends. 1.0: off.
    length_decay_start: int = 0
    length_decay_factor: float = 1.0
    sources: tuple[tuple[str, str], ...] = ()  # (parameter, source) of every parameter set

    def values(self) -> dict[str, float | int]:
        return {name: getattr(self, name) for name in PARAMETERS}

    def source_of(self, name: str) -> str | None:
        return dict(self.sources).get(name)

    def describe(self) -> str:
        """One line for the start-up log: `temperature 0.2 (preset smollm2), top_p 0.9 (...)`."""
        if not self.sources:
            return "none (the APIs' own: temperature 1.0, no top-k/top-p/min-p, no penalties)"
        return ", ".join(f"{name} {getattr(self, name):g} ({source})" for name, source in self.sources)

    def to_json(self) -> dict[str, Any]:
        """For /v1/models: the values, and the source of each one set."""
        return {"values": self.values(), "sources": dict(self.sources)}


PARAMETERS = tuple(f.name for f in fields(SamplingDefaults) if f.name != "sources")
_INTS = {"top_k", "repetition_last_n", "dry_allowed_length", "length_decay_start"}

LLAMA_CPP_SOURCE = "llama.cpp default"
# llama.cpp's common_params_sampling (common/common.h): the chain a llama-server request gets for
# every field it leaves out. Its penalties are off by default (repeat_penalty 1.0, last_n 64).
LLAMA_CPP_DEFAULTS: Mapping[str, float | int] = {
    "temperature": 0.8,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
}

# generation_config.json keys vLLM applies as request defaults (vllm/config: get_diff_sampling_param);
# HF's names are ours.
_HF_KEYS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")
# llama.cpp's GGUF keys (gguf-py's Keys.General.SAMPLING_*) and the parameter each one sets.
_GGUF_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
    "general.sampling.penalty_last_n": "repetition_last_n",
}
# A GGUF that sets penalty_repeat without penalty_last_n gets llama.cpp's window.
_LLAMA_CPP_LAST_N = 64


class GenerationConfigError(ValueError):
    """A bad --override-generation-config (the CLI turns it into a usage error)."""


def from_hf_generation_config(config: Mapping[str, Any]) -> dict[str, float | int]:
    """The sampling parameters an HF `generation_config.json` recommends (invalid values skipped)."""
    return _valid({key: config[key] for key in _HF_KEYS if key in config})


def from_gguf_metadata(metadata: Mapping[str, Any]) -> dict[str, float | int]:
    """The sampling parameters a GGUF's `general.sampling.*` keys recommend."""
    found = {name: metadata[key] for key, name in _GGUF_KEYS.items() if key in metadata}
    if "repetition_penalty" in found:
        found.setdefault("repetition_last_n", _LLAMA_CPP_LAST_N)
    return _valid(found)


def read_model_sampling(path: Path) -> tuple[dict[str, float | int], str]:
    """The model file's own recommendation and its name for the log: an HF folder's
    generation_config.json, a GGUF file's metadata. Unreadable or absent: nothing."""
    if path.is_dir():
        config_file = path / "generation_config.json"
        try:
            config = json.loads(config_file.read_text())
        except (OSError, ValueError):
            return {}, ""
        values = from_hf_generation_config(config) if isinstance(config, dict) else {}
        return values, "generation_config.json"
    from kvserve.models.errors import ModelLoadError
    from kvserve.models.loader.gguf_reader import read_gguf

    try:
        metadata = read_gguf(path).metadata
    except (ModelLoadError, OSError):
        return {}, ""
    return from_gguf_metadata(metadata), "GGUF general.sampling"


def parse_overrides(text: str) -> dict[str, float | int]:
    """--override-generation-config: a JSON object of parameters (vLLM's flag; HF's names, plus
    `repetition_last_n`). Unknown names and out-of-range values are errors, not skipped."""
    try:
        given = json.loads(text)
    except ValueError as error:
        raise GenerationConfigError(f"not JSON: {error}") from None
    if not isinstance(given, dict):
        raise GenerationConfigError("expected a JSON object, e.g. '{\"temperature\": 0.2}'")
    unknown = sorted(set(given) - set(PARAMETERS))
    if unknown:
        raise GenerationConfigError(
            f"unknown parameter(s) {', '.join(unknown)} (known: {', '.join(PARAMETERS)})"
        )
    valid = _valid(given)
    bad = sorted(set(given) - set(valid))
    if bad:
        raise GenerationConfigError(f"invalid value(s) for {', '.join(f'{k}={given[k]!r}' for k in bad)}")
    return valid


def resolve_sampling_defaults(
    mode: str,
    model_values: Mapping[str, float | int] = {},
    model_source: str = "model",
    preset: Mapping[str, float | int] = {},
    preset_source: str = "preset",
    overrides: Mapping[str, float | int] = {},
) -> SamplingDefaults:
    """Each parameter from the highest layer that sets it (the module docstring's order)."""
    if mode not in GENERATION_CONFIG_MODES:
        raise GenerationConfigError(
            f"--generation-config must be one of {GENERATION_CONFIG_MODES}, got {mode!r}"
        )
    layers: list[tuple[Mapping[str, float | int], str]] = [(overrides, "--override-generation-config")]
    if mode == "auto":
        layers += [
            (model_values, model_source),
            (preset, preset_source),
            (LLAMA_CPP_DEFAULTS, LLAMA_CPP_SOURCE),
        ]
    chosen: dict[str, float | int] = {}
    sources: list[tuple[str, str]] = []
    for name in PARAMETERS:
        for values, source in layers:
            if name in values:
                chosen[name] = values[name]
                sources.append((name, source))
                break
    return replace(SamplingDefaults(), **chosen, sources=tuple(sources))


def _valid(given: Mapping[str, Any]) -> dict[str, float | int]:
    """The entries that are numbers in the engine's ranges (SamplingParams' checks), typed."""
    valid: dict[str, float | int] = {}
    for name, value in given.items():
        if name not in PARAMETERS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value) or not _in_range(name, value):
            continue
        if name in _INTS:
            if value != int(value):
                continue
            valid[name] = int(value)
        else:
            valid[name] = float(value)
    return valid


def _in_range(name: str, value: float) -> bool:
    return {
        "temperature": value >= 0,
        "top_k": value >= -1,
        "top_p": 0 < value <= 1,
        "min_p": 0 <= value <= 1,
        "repetition_penalty": 0 < value <= 10,
        "repetition_last_n": value >= 0,
        "presence_penalty": -2 <= value <= 2,
        "frequency_penalty": -2 <= value <= 2,
        "dry_multiplier": 0 <= value <= 10,
        "dry_base": 1 <= value <= 10,
        "dry_allowed_length": value >= 1,
        "length_decay_start": value >= 0,
        "length_decay_factor": 1 <= value <= 10,
    }[name]
