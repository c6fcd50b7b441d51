"""The import-cycle finder: every import counts, wherever it stands; app_common itself has no cycle."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from app_common.imports import import_cycles, import_graph
from app_common.testing import assert_no_import_cycle


def _package(root: Path, name: str, files: dict[str, str]) -> str:
    folder = root / name
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    for module, text in files.items():
        (folder / f"{module}.py").write_text(text)
    return name


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("pkg_")]:
        del sys.modules[name]


def test_an_import_inside_a_function_closes_a_cycle(on_path):
    name = _package(
        on_path,
        "pkg_function",
        {"a": "from pkg_function.b import x\n", "b": "def f():\n    from pkg_function.a import y\n"},
    )
    assert import_cycles(name) == [["pkg_function.a", "pkg_function.b"]]


def test_an_import_under_type_checking_closes_a_cycle(on_path):
    files = {
        "a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import b\n",
        "b": "from .a import y\n",
    }
    name = _package(on_path, "pkg_typing", files)
    assert import_cycles(name) == [["pkg_typing.a", "pkg_typing.b"]]


def test_from_a_package_import_a_module_is_an_edge_to_the_module(on_path):
    name = _package(on_path, "pkg_edges", {"a": "from pkg_edges import b\n", "b": "X = 1\n"})
    assert import_graph(name)["pkg_edges.a"] == {"pkg_edges.b"}


def test_a_chain_of_imports_is_no_cycle(on_path):
    name = _package(
        on_path, "pkg_chain", {"a": "import pkg_chain.b\n", "b": "from pkg_chain import c\n", "c": ""}
    )
    assert import_cycles(name) == []


def test_app_common_has_no_import_cycle():
    assert_no_import_cycle("app_common")
