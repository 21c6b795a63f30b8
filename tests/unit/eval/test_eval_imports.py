"""kvserve/eval talks HTTP only: it never imports the engine, models, serving, api or torch."""

from __future__ import annotations

import ast
from pathlib import Path

FORBIDDEN = {"engine", "models", "serving", "api", "kvstore", "torch"}
ROOT = Path(__file__).resolve().parents[3] / "kvserve" / "eval"


def test_eval_imports_no_engine_internals() -> None:
    violations = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.append(node.module)
            for name in names:
                parts = name.split(".")
                target = parts[1] if parts[0] == "kvserve" and len(parts) > 1 else parts[0]
                if target in FORBIDDEN:
                    violations.append(f"{path.name} imports {name}")
    assert not violations
