"""The import graph of an installed package, counting every import wherever it stands.

An import inside a function or under ``TYPE_CHECKING`` is an edge like any other: two modules that need
each other share a third, leaf module instead. [`import_cycles`][app_common.imports.import_cycles] reads
the sources (nothing is imported) and returns the strongly connected groups of the graph.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Mapping
from pathlib import Path


def _modules(package: str) -> dict[str, Path]:
    """Module name -> source file, for ``package`` and every module below it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"package: {package!r} is not an installed package")
    root = Path(next(iter(spec.submodule_search_locations)))
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(module: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The modules of ``modules`` that ``module``'s source imports, at any depth of its syntax tree.

    ``from p import m`` is an edge to ``p.m`` when that is a module, else to ``p``; ``from p.m import
    name`` is an edge to ``p.m`` alone, not to the packages above it.
    """
    names: set[str] = set()
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parent = node.module or ""
            if node.level:
                head = base[: len(base) - node.level + 1]
                parent = ".".join([*head, parent] if parent else head)
            for alias in node.names:
                names.add(f"{parent}.{alias.name}" if f"{parent}.{alias.name}" in modules else parent)
    return {name for name in names if name in modules and name != module}


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (every import statement, wherever it stands)."""
    modules = _modules(package)
    return {module: _imported(module, path, modules) for module, path in modules.items()}


def import_cycles(package: str) -> list[list[str]]:
    """The import cycles inside ``package``: each strongly connected group of two or more modules, sorted."""
    graph = import_graph(package)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)
