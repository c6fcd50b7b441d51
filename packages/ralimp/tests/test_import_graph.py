"""ralimp's import graph: acyclic over every import wherever it stands, no private name across modules."""

import ast
from pathlib import Path

import ralimp
from spectraformer_core.testing import assert_no_import_cycle

PACKAGE = Path(ralimp.__file__).parent


def test_ralimp_has_no_import_cycle():
    assert_no_import_cycle("ralimp")


def test_no_module_of_ralimp_imports_a_private_name_of_another():
    private = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                names = [alias.name for alias in node.names]
                module = path.relative_to(PACKAGE.parent).with_suffix("").as_posix()
                private += [f"{module}: {name}" for name in names if name.startswith("_")]
    assert private == []
