"""Sampling defaults, one test per source (models/generation_config.py): the model's own
generation_config.json and GGUF general.sampling.* keys, kvserve's preset for the default model,
llama.cpp's fallback, the override flag, and `--generation-config none`."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from kvserve.models.aliases import sampling_preset
from kvserve.models.generation_config import (
    LLAMA_CPP_DEFAULTS,
    GenerationConfigError,
    SamplingDefaults,
    from_gguf_metadata,
    from_hf_generation_config,
    parse_overrides,
    read_model_sampling,
    resolve_sampling_defaults,
)


def test_llama_cpp_fallback_for_a_model_that_recommends_nothing() -> None:
    defaults = resolve_sampling_defaults("auto")
    assert defaults.values() == SamplingDefaults().values() | dict(LLAMA_CPP_DEFAULTS)
    assert (defaults.temperature, defaults.top_k, defaults.top_p, defaults.min_p) == (0.8, 40, 0.95, 0.05)
    assert defaults.source_of("temperature") == "llama.cpp default"
    assert defaults.source_of("repetition_penalty") is None and defaults.repetition_penalty == 1.0


def test_hf_generation_config_wins_per_parameter(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "generation_config.json").write_text(
        json.dumps(
            {
                "do_sample": True,
                "temperature": 0.6,
                "top_p": 0.95,
                "top_k": 20,
                "max_new_tokens": 9,
                "repetition_penalty": 1.05,
                "eos_token_id": [1, 2],
                "min_p": "bad",
            }
        )
    )
    values, source = read_model_sampling(tmp_path)
    assert values == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.05}
    defaults = resolve_sampling_defaults("auto", values, source, preset={"temperature": 0.2, "top_k": 3})
    assert (defaults.temperature, defaults.top_k, defaults.top_p) == (
        0.6,
        20,
        0.95,
    )  # the model's, not the preset's
    assert defaults.min_p == 0.05 and defaults.source_of("min_p") == "llama.cpp default"
    assert defaults.source_of("temperature") == "generation_config.json"
    assert defaults.repetition_last_n == 0  # HF's penalty looks at the whole sequence


def test_hf_folder_without_or_with_a_broken_generation_config(tmp_path: Path) -> None:
    assert read_model_sampling(tmp_path) == ({}, "")
    (tmp_path / "generation_config.json").write_text("{not json")
    assert read_model_sampling(tmp_path) == ({}, "")


def test_gguf_sampling_keys(tmp_path: Path) -> None:
    metadata = {
        "general.sampling.temp": 0.7,
        "general.sampling.top_k": 20,
        "general.sampling.min_p": 0.0,
        "general.sampling.penalty_repeat": 1.1,
        "general.sampling.mirostat": 0,
    }
    # penalty_repeat without penalty_last_n gets llama.cpp's window of 64
    assert from_gguf_metadata(metadata) == {
        "temperature": 0.7,
        "top_k": 20,
        "min_p": 0.0,
        "repetition_penalty": 1.1,
        "repetition_last_n": 64,
    }
    assert from_gguf_metadata(metadata | {"general.sampling.penalty_last_n": 256})["repetition_last_n"] == 256
    path = tmp_path / "m.gguf"
    path.write_bytes(
        _gguf({"general.architecture": "llama", "general.sampling.temp": 0.3, "general.sampling.top_p": 0.5})
    )
    values, source = read_model_sampling(path)
    assert values == {"temperature": pytest.approx(0.3), "top_p": 0.5} and source == "GGUF general.sampling"
    defaults = resolve_sampling_defaults("auto", values, source)
    assert defaults.top_k == 40 and defaults.source_of("top_p") == "GGUF general.sampling"
    (tmp_path / "bad.gguf").write_bytes(b"GGUF\x03\x00")
    assert read_model_sampling(tmp_path / "bad.gguf") == ({}, "")


def test_invalid_recommendations_are_skipped() -> None:
    given = {"temperature": -1, "top_p": 0, "top_k": 2.5, "min_p": True, "repetition_penalty": float("nan")}
    assert from_hf_generation_config(given) == {}


def test_preset_of_the_default_model_under_the_model_and_over_llama_cpp() -> None:
    preset = sampling_preset("smollm2")
    assert preset is not None and sampling_preset("SmolLM2-135M") == preset
    assert sampling_preset("gemma3-270m") is None and sampling_preset("/no/such/file.gguf") is None
    defaults = resolve_sampling_defaults("auto", preset=preset.values, preset_source=preset.source)
    for name, value in preset.values.items():
        assert getattr(defaults, name) == value and defaults.source_of(name) == preset.source
    assert defaults.top_k == 40  # what the preset leaves out still comes from llama.cpp


def test_overrides_win_and_none_mode_keeps_the_apis_own() -> None:
    overrides = parse_overrides('{"temperature": 0, "repetition_penalty": 1.2, "repetition_last_n": 32}')
    defaults = resolve_sampling_defaults(
        "auto", {"temperature": 0.6}, "generation_config.json", overrides=overrides
    )
    assert defaults.temperature == 0 and defaults.source_of("temperature") == "--override-generation-config"
    assert (defaults.repetition_penalty, defaults.repetition_last_n) == (1.2, 32)
    none = resolve_sampling_defaults("none", {"temperature": 0.6}, "generation_config.json", {"top_k": 3})
    assert none.values() == SamplingDefaults().values() and none.sources == ()
    assert "temperature 1.0" in none.describe()
    assert resolve_sampling_defaults("none", overrides={"top_k": 5}).top_k == 5
    with pytest.raises(GenerationConfigError):
        resolve_sampling_defaults("vllm")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1]", "JSON object"),
        ("{", "not JSON"),
        ('{"temp": 1}', "unknown parameter(s) temp"),
        ('{"top_p": 2}', "invalid value"),
        ('{"top_k": 1.5}', "invalid value"),
        ('{"min_p": "x"}', "invalid value"),
    ],
)
def test_bad_overrides_are_errors(text: str, message: str) -> None:
    with pytest.raises(GenerationConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_overrides(text)


def test_describe_and_json_name_each_source() -> None:
    defaults = resolve_sampling_defaults("auto", preset={"temperature": 0.2}, preset_source="card")
    assert defaults.describe().startswith("temperature 0.2 (card), top_k 40 (llama.cpp default)")
    assert defaults.to_json()["sources"]["temperature"] == "card"
    assert defaults.to_json()["values"]["top_k"] == 40


def _gguf(metadata: dict[str, object]) -> bytes:
    """A GGUF v3 header with string and float32 metadata and no tensors."""
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(metadata))
    for key, value in metadata.items():
        out += struct.pack("<Q", len(key)) + key.encode()
        if isinstance(value, str):
            out += struct.pack("<IQ", 8, len(value)) + value.encode()
        else:
            out += struct.pack("<If", 6, value)
    return out
