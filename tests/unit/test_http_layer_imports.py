"""Import rules of the HTTP side beyond tests/unit/test_import_rules.py: `chat` imports nothing else
from kvserve at all, `serving` reaches the engine through one module, and building the app loads no
torch (checked by really importing it, which also catches indirect imports)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "kvserve"


def _imports(package: str) -> list[tuple[Path, str]]:
    found = []
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found += [(path, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append((path, node.module))
    return found


def test_chat_imports_only_itself() -> None:
    bad = [
        (p.name, m)
        for p, m in _imports("chat")
        if m.startswith("kvserve") and not m.startswith("kvserve.chat")
    ]
    assert not bad


def test_serving_reaches_the_engine_only_through_engine_protocol() -> None:
    bad = [
        (p.name, m)
        for p, m in _imports("serving")
        if m.startswith(("kvserve.engine", "kvserve.models", "kvserve.api"))
        and p.name != "engine_protocol.py"
    ]
    assert not bad


def test_building_the_app_loads_no_torch() -> None:
    code = "import sys, kvserve.api.app, kvserve.serving.chat_service; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT.parent)
