"""`relative_error`, `assert_rel_close`, `rounding_tolerance`, `seeded_randn`, `torch_threads` and the
import-cycle finder (every import counts, wherever it stands): what the tests share."""

import math
import sys
from pathlib import Path

import pytest
import torch

from spectraformer_core.testing import (
    assert_no_import_cycle,
    assert_rel_close,
    import_cycles,
    import_graph,
    relative_error,
    rounding_tolerance,
    seeded_randn,
    torch_threads,
)

REFERENCE = torch.tensor([[3.0, 0.0], [0.0, 4.0]], dtype=torch.float64)  # norm 5
OFF_BY_A_TENTH = REFERENCE + torch.tensor([[0.0, 0.3], [0.4, 0.0]], dtype=torch.float64)  # norm 0.5 off


def sequential_float32_sum(x: torch.Tensor) -> torch.Tensor:
    """Row sums of ``x (rows, n)`` added left to right in float32, one rounding per term (no wider sum)."""
    total = torch.zeros(x.shape[0], dtype=torch.float32)
    for column in x.float().unbind(-1):
        total += column
    return total.double()


def test_rounding_tolerance_bounds_two_float32_summation_orders_within_a_small_factor():
    # positive terms (the normalizer's): partial sums grow with n, the worst case of the sqrt(n) bound
    x = seeded_randn(200, 4096, seed=1, dtype=torch.float64).abs()
    forward, backward = sequential_float32_sum(x), sequential_float32_sum(x.flip(-1))
    differences = (forward - backward).abs() / x.sum(-1)
    tolerance = rounding_tolerance(torch.float32, 4096)
    assert tolerance / 100 < float(differences.max()) <= tolerance  # a bound, and not a vacuous one
    assert rounding_tolerance(torch.float64, 4096, condition=10.0) == pytest.approx(
        10 * tolerance * torch.finfo(torch.float64).eps / torch.finfo(torch.float32).eps
    )


def test_relative_error_is_the_difference_norm_over_the_reference_norm():
    assert relative_error(OFF_BY_A_TENTH, REFERENCE) == pytest.approx(0.1, rel=1e-12)


def test_relative_error_is_computed_in_float64_from_any_dtype():
    # 300 and 303 are exact in float16; their relative error 0.01 is not (float16 holds about 3 digits).
    reference = torch.full((4,), 300.0, dtype=torch.float16)
    assert relative_error(reference + 3, reference) == pytest.approx(0.01, rel=1e-12)


def test_relative_error_against_zeros_is_the_norm_of_the_result():
    assert relative_error(torch.tensor([0.6, 0.8]), torch.zeros(2)) == pytest.approx(1.0)
    assert relative_error(torch.zeros(3), torch.zeros(3)) == 0.0


def test_relative_error_of_a_nan_is_nan():
    assert math.isnan(relative_error(torch.tensor([1.0, math.nan]), torch.ones(2)))


def test_relative_error_refuses_shapes_that_would_broadcast():
    with pytest.raises(ValueError, match=r"actual: expected the shape of reference \(2, 2\), got \(2,\)"):
        relative_error(torch.ones(2), torch.ones(2, 2))


def test_assert_rel_close_passes_within_the_tolerance():
    assert_rel_close("output", REFERENCE, OFF_BY_A_TENTH, 0.11)


def test_assert_rel_close_names_the_error_the_tolerance_and_the_reference():
    with pytest.raises(AssertionError) as error:
        assert_rel_close("dq float32", REFERENCE, OFF_BY_A_TENTH, 0.05)
    assert str(error.value) == (
        "dq float32: relative error 1.0e-01 > tolerance 5.0e-02 (||reference|| = 5, shape (2, 2))"
    )


def test_assert_rel_close_fails_on_a_nan():
    with pytest.raises(AssertionError, match=r"relative error nan > tolerance"):
        assert_rel_close("output", torch.ones(2), torch.tensor([1.0, math.nan]), 1.0)


def test_seeded_randn_depends_only_on_its_seed():
    first = seeded_randn(3, 4, seed=7, dtype=torch.float64)
    torch.randn(10)  # the global RNG moves; the draw does not
    assert torch.equal(seeded_randn(3, 4, seed=7, dtype=torch.float64), first)


def test_seeded_randn_scales_the_standard_normal_draw():
    unit = seeded_randn(5, seed=1)
    assert torch.equal(seeded_randn(5, seed=1, scale=2.5), unit * 2.5)


def test_torch_threads_sets_the_count_inside_and_restores_it_after():
    before = torch.get_num_threads()
    target = 2 if before == 1 else 1
    with torch_threads(target):
        inside = torch.get_num_threads()
    assert (inside, torch.get_num_threads()) == (target, before)


def test_torch_threads_restores_the_count_after_an_exception():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError), torch_threads(2 if before == 1 else 1):
        raise RuntimeError("inside")
    assert torch.get_num_threads() == before


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


def test_the_cycle_check_names_each_cycle_and_passes_an_acyclic_package(on_path):
    name = _package(on_path, "pkg_named", {"a": "import pkg_named.b\n", "b": "import pkg_named.a\n"})
    with pytest.raises(AssertionError, match=r"pkg_named: import cycles pkg_named.a <-> pkg_named.b"):
        assert_no_import_cycle(name)
    assert_no_import_cycle(_package(on_path, "pkg_acyclic", {"a": "import pkg_acyclic.b\n", "b": ""}))


def test_spectraformer_core_has_no_import_cycle():
    assert_no_import_cycle("spectraformer_core")


def test_a_relative_import_resolves_against_its_package_and_a_name_against_its_module(on_path):
    name = _package(on_path, "pkg_relative", {"a": "def f():\n    pass\n"})
    (on_path / name / "sub").mkdir()
    (on_path / name / "sub" / "__init__.py").write_text("from .x import g\n")
    (on_path / name / "sub" / "x.py").write_text("from ..a import f\nimport pkg_relative.a.f\n")
    graph = import_graph(name)
    assert graph["pkg_relative.sub.x"] == {"pkg_relative.a"}
    assert graph["pkg_relative.sub"] == {"pkg_relative.sub.x"}
