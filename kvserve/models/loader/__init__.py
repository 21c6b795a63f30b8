"""Model loading. `load_model` (in `load.py`) turns a GGUF file, an HF safetensors folder or an alias
into a `LoadedModel`; it is imported on first use, because it brings in torch and the model
families, and the package's other names (errors, `resolve_model_path`, the tokenizer and GGUF
readers in their submodules) serve callers that need no weights, such as the benchmark clients.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvserve.models.errors import (
    CorruptModelFileError,
    ModelLoadError,
    ModelNotFoundError,
    UnsupportedModelError,
)
from kvserve.models.loader.paths import resolve_model_path
from kvserve.models.rope_scaling import ContextError, ContextRequest

if TYPE_CHECKING:
    from kvserve.models.loader.load import load_model

__all__ = [
    "ContextError",
    "ContextRequest",
    "CorruptModelFileError",
    "ModelLoadError",
    "ModelNotFoundError",
    "UnsupportedModelError",
    "load_model",
    "resolve_model_path",
]


def __getattr__(name: str) -> Any:
    if name == "load_model":
        from kvserve.models.loader.load import load_model

        return load_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
