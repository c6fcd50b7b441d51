import pytest

from app_common.cli import app_parser
from app_common.testing import assert_app_contract
from spectraformer_core.testing import assert_no_import_cycle


def test_app_common_has_no_import_cycle():
    assert_no_import_cycle("app_common")


def test_the_app_contract_is_the_flag_vocabulary_and_an_acyclic_import_graph(tmp_path, monkeypatch):
    parser, commands = app_parser("toy", "A toy app.")
    for name in ("train", "quick", "report", "list"):
        commands.add_parser(name)
    assert_app_contract(parser, "app_common")
    with pytest.raises(AssertionError, match="flag vocabulary"):
        assert_app_contract(app_parser("bad", "A bad app.")[0], "app_common")
    (tmp_path / "toy_cyclic").mkdir()
    for module, other in (("__init__", "a"), ("a", "b"), ("b", "a")):
        (tmp_path / "toy_cyclic" / f"{module}.py").write_text(f"from toy_cyclic import {other}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AssertionError, match=r"toy_cyclic: import cycles toy_cyclic.a <-> toy_cyclic.b"):
        assert_app_contract(parser, "toy_cyclic")
