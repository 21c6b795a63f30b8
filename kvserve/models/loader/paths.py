"""Where a model spec (a path or an alias) points: light, so tokenizer-only callers (the benchmark
clients) never import torch."""

from __future__ import annotations

from pathlib import Path

from kvserve.models.aliases import alias_names, resolve_alias
from kvserve.models.errors import ModelNotFoundError


def resolve_model_path(spec: str | Path) -> Path:
    """An existing path as given; otherwise an alias (smollm2, gemma3-270m) resolved to its file."""
    path = Path(spec).expanduser()
    if not path.exists() and isinstance(spec, str):
        alias_path = resolve_alias(spec)
        if alias_path is not None:
            return alias_path
    if not path.exists():
        known = ", ".join(alias_names())
        raise ModelNotFoundError(path, f"no such file or directory, and not a known model name ({known})")
    if path.is_dir() and not (path / "config.json").is_file():
        raise ModelNotFoundError(path, "directory has no config.json (expected a Hugging Face model folder)")
    return path
