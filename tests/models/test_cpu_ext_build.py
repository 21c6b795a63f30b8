"""Where the CPU kernels are built: one folder per source content, whatever checkout they come from."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvserve.models.layers import cpu_ext


def _checkout(root: Path, body: str) -> Path:
    csrc = root / "csrc"
    csrc.mkdir(parents=True)
    (csrc / "a.cpp").write_text(body)
    (csrc / "k.h").write_text("// header\n")
    (csrc / "notes.txt").write_text("not a source")
    return csrc


def test_two_checkouts_of_the_same_sources_share_one_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    first = cpu_ext._build_folders(_checkout(tmp_path / "one", "int f();\n"))
    second = cpu_ext._build_folders(_checkout(tmp_path / "two", "int f();\n"))
    assert first == second
    name, src, build = first
    assert src.parent == build.parent == tmp_path / "cache" / name and build.is_dir()
    assert sorted(p.name for p in src.iterdir()) == ["a.cpp", "k.h"]  # copied; other files left out
    assert [p.name for p in src.parent.iterdir() if p.name.startswith("src-")] == []  # no staging left


def test_changed_sources_build_in_a_new_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    old, _, _ = cpu_ext._build_folders(_checkout(tmp_path / "one", "int f();\n"))
    new, src, _ = cpu_ext._build_folders(_checkout(tmp_path / "two", "int g();\n"))
    assert old != new and (src / "a.cpp").read_text() == "int g();\n"
