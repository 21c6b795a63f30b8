"""DESIGN §1 import rules, checked on the source (no imports executed): the layering between
packages, and no circle between modules."""

from __future__ import annotations

import ast
import functools
import itertools
from collections import deque
from pathlib import Path
from typing import NamedTuple

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
    # Tensor parallelism sits under the engine: the disk tier sees reassembled KV, never ranks, and
    # the engine drives the ranks (`engine/tensor_parallel/`) over these torch-level pieces.
    "distributed": {"engine", "serving", "api", "chat", "cli", "kvstore"},
    "api": {"engine", "models", "torch"},
    "agent": {"engine", "models", "serving", "api", "torch", "cli"},
    "eval": {"engine", "models", "cli"},
    # A cluster replica reaches its engine only through `kvserve serve`'s composition (cli/serve.py).
    "cluster": {"engine", "models"},
    # The CLI runs the benchmarks (`kvserve bench`), never the other way round.
    "bench": {"cli"},
}


# Circles that another branch resolves. Each must still occur here: drop it once it does not.
class Import(NamedTuple):
    importer: str  # dotted module name
    imported: str  # the module it names: the submodule where `from package import name` names one
    line: int


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def imports(root: Path) -> tuple[Import, ...]:
    """Every import statement of the package at `root`: at module level, under TYPE_CHECKING and
    inside functions alike (why: `test_no_circle_between_modules`)."""
    paths = sorted(root.rglob("*.py"))
    modules = {module_name(path, root) for path in paths}
    found = []
    for path in paths:
        importer = module_name(path, root)
        package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found += [Import(importer, alias.name, node.lineno) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    found.append(Import(importer, sub if sub in modules else base, node.lineno))
    return tuple(found)


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    """module -> {project module it imports: the line of the first such import}."""
    graph: dict[str, dict[str, int]] = {module_name(p, root): {} for p in root.rglob("*.py")}
    for site in imports(root):
        target = site.imported
        while target not in graph and "." in target:  # `import a.b.name` style: the module that holds it
            target = target.rpartition(".")[0]
        if target in graph and target != site.importer:
            graph[site.importer].setdefault(target, site.line)
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[set[str]]:
    """Tarjan's strongly connected components with more than one module: each holds a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = {stack.pop()}
            while module not in component:
                component.add(stack.pop())
            if len(component) > 1:
                components.append(component)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return components


def describe_circle(graph: dict[str, dict[str, int]], component: set[str]) -> str:
    """One circle through the component, each hop with the line of its import."""
    start = min(component)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        for target in sorted(graph[module]):
            if target in component and target not in came_from:
                came_from[target] = module
                queue.append(target)
    path = [start]
    while path[-1] != start or len(path) == 1:
        path.append(came_from[path[-1]])
    path.reverse()
    hops = [f"{a}:{graph[a][b]}" for a, b in itertools.pairwise(path)]
    return " -> ".join([*hops, start])


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_respect_the_layering(package: str) -> None:
    violations = []
    for site in imports(ROOT):
        parts = site.importer.split(".")
        if len(parts) < 2 or parts[1] != package:
            continue
        names = site.imported.split(".")
        target = names[1] if names[0] == "kvserve" and len(names) > 1 else names[0]
        if target in FORBIDDEN[package] and (names[0] == "kvserve" or target == "torch"):
            violations.append(f"{site.importer}:{site.line} imports {site.imported}")
    assert not violations


def test_no_circle_between_modules() -> None:
    # Lazy imports count too. One kept for start-up cost (torch, Triton, the engine behind the CLI's
    # parser) points down the layers and never closes a circle; one that closes a circle hides it.
    graph = import_graph(ROOT)
    circles = strongly_connected(graph)
    assert not circles, "\n".join(describe_circle(graph, c) for c in circles)


def test_a_lazy_or_type_checking_import_that_closes_a_circle_is_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from pkg import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n"
    )
    (package / "c.py").write_text("import pkg.a\n")
    graph = import_graph(package)
    assert strongly_connected(graph) == [{"pkg.a", "pkg.b", "pkg.c"}]
    assert describe_circle(graph, {"pkg.a", "pkg.b", "pkg.c"}) == "pkg.a:2 -> pkg.b:3 -> pkg.c:1 -> pkg.a"
