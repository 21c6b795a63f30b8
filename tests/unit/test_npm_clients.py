"""The real-client tests' npm installer: skips for missing Node/npm or an unreachable registry, fails
on any other npm error, installs once per version (fake `node`/`npm` scripts on PATH)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.npm_clients import NpmClient, installed_client

CLIENT = NpmClient("@example/agent", "1.2.3", "agent")


def _fake_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, npm_script: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("node", "exit 0"), ("npm", npm_script)):
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")  # ours first, then sh, mkdir, touch
    return bin_dir


def test_missing_npm_is_a_skip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.skip.Exception, match="node is not on PATH"):
        installed_client(CLIENT, tmp_path / "cache")


def test_unreachable_registry_is_a_skip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_tools(tmp_path, monkeypatch, "echo 'npm error code ENOTFOUND registry.npmjs.org' >&2; exit 1")
    with pytest.raises(pytest.skip.Exception, match="registry is unreachable"):
        installed_client(CLIENT, tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []  # the staging folder is gone


def test_other_npm_errors_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_tools(tmp_path, monkeypatch, "echo 'npm error code ETARGET no matching version' >&2; exit 1")
    with pytest.raises(AssertionError, match="ETARGET"):
        installed_client(CLIENT, tmp_path / "cache")


def test_installs_once_per_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The fake npm creates the binary under --prefix ($3) and counts its calls.
    script = 'echo x >> "$COUNT"; mkdir -p "$3/node_modules/.bin"; touch "$3/node_modules/.bin/agent"'
    _fake_tools(tmp_path, monkeypatch, script)
    monkeypatch.setenv("COUNT", str(tmp_path / "count"))
    first = installed_client(CLIENT, tmp_path / "cache")
    assert installed_client(CLIENT, tmp_path / "cache") == first
    assert first == tmp_path / "cache" / "@example+agent@1.2.3" / "node_modules" / ".bin" / "agent"
    assert (tmp_path / "count").read_text() == "x\n"
