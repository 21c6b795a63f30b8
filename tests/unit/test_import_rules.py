"""DESIGN §1 import rules, checked on the source (no imports executed)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "kvserve"

# package -> project packages it must not import
FORBIDDEN = {
    "chat": {"engine", "models", "serving", "api", "kvstore", "toolcalls", "reasoning", "cli", "client"},
    "toolcalls": {"engine", "models", "serving", "api", "kvstore", "chat", "reasoning", "cli", "client"},
    "reasoning": {"engine", "models", "serving", "api", "kvstore", "chat", "toolcalls", "cli", "client"},
    "models": {"engine", "serving", "api", "kvstore", "cli"},
    "engine": {"serving", "api", "chat", "cli"},
    "kvstore": {"engine", "serving", "api", "cli"},
    # Tensor parallelism sits under the engine: the disk tier sees reassembled KV, never ranks.
    "distributed": {"serving", "api", "chat", "cli", "kvstore"},
    "api": {"engine", "models", "torch"},
    "agent": {"engine", "models", "serving", "api", "torch"},
}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_respect_the_layering(package: str) -> None:
    violations = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in _imports(path):
            parts = name.split(".")
            target = parts[1] if parts[0] == "kvserve" and len(parts) > 1 else parts[0]
            if target in FORBIDDEN[package] and (parts[0] == "kvserve" or target == "torch"):
                violations.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not violations
