"""ralimp's import graph: acyclic over every import wherever it stands, no private name across modules."""

import ast
import graphlib
from pathlib import Path

import ralimp

PACKAGE = Path(ralimp.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports: in functions, under ``TYPE_CHECKING``, anywhere."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            source = ".".join([*base, node.module] if node.module else base)
            targets = [source, *(f"{source}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def test_the_modules_of_ralimp_form_an_acyclic_import_graph():
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    graph = {module_name(p): imported_modules(p, modules) for p in paths}
    assert graph["ralimp.analysis"] >= {"ralimp.layer", "ralimp.moments"}  # the parser sees the imports
    graphlib.TopologicalSorter(graph).prepare()  # raises graphlib.CycleError on a cycle


def test_no_module_of_ralimp_imports_a_private_name_of_another():
    private = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                names = [alias.name for alias in node.names]
                private += [f"{module_name(path)}: {name}" for name in names if name.startswith("_")]
    assert private == []
