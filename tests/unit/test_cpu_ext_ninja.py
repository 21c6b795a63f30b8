"""The CPU kernels build with ninja even where the system has none (the venv's PyPI wheel)."""

from __future__ import annotations

import shutil

import pytest

from kvserve.models.layers import cpu_ext


def test_ninja_from_the_wheel_when_path_has_none(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ninja")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert shutil.which("ninja") is None
    cpu_ext._put_ninja_on_path()
    assert shutil.which("ninja") is not None
