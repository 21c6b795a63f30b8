"""Typed failures of model loading: each message is one line naming the file and the problem."""

from __future__ import annotations

from pathlib import Path


class ModelLoadError(Exception):
    """Base class: the model at `path` could not be loaded."""

    def __init__(self, path: str | Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = Path(path)
        self.problem = problem


class ModelNotFoundError(ModelLoadError):
    """No such file, a folder without config.json, or an unknown alias."""


class CorruptModelFileError(ModelLoadError):
    """The file exists but is not a readable model file (bad magic, truncated, inconsistent)."""


class UnsupportedModelError(ModelLoadError):
    """A well-formed file that kvserve cannot run: unknown architecture or tensor type."""
