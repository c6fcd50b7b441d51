import pytest
import torch

from spectraformer_core import (
    Registry,
    check_int,
    check_positive_int,
    make_generator,
    markdown_table,
    resolve_device,
)


def test_same_seed_gives_the_same_draws():
    a = torch.randn(5, generator=make_generator(3, None), dtype=torch.float64)
    b = torch.randn(5, generator=make_generator(3, None), dtype=torch.float64)
    assert torch.equal(a, b)


def test_unseeded_generator_follows_the_global_torch_seed():
    torch.manual_seed(0)
    a = torch.randn(3, generator=make_generator(None, None))
    torch.manual_seed(0)
    b = torch.randn(3, generator=make_generator(None, None))
    assert torch.equal(a, b)


def test_an_explicit_generator_is_used_as_it_is_and_excludes_a_seed():
    g = torch.Generator()
    assert make_generator(None, g) is g
    with pytest.raises(ValueError, match="seed, generator: pass at most one"):
        make_generator(1, g)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3", None])
def test_check_positive_int_names_the_argument(bad):
    with pytest.raises(ValueError, match=r"num_features: expected an integer >= 1, got"):
        check_positive_int("num_features", bad)


def test_check_int_takes_a_minimum():
    assert check_int("redraw_interval", 0, minimum=0) == 0
    with pytest.raises(ValueError, match=r"max_args: expected an integer >= 2, got 1"):
        check_int("max_args", 1, minimum=2)


def test_unknown_name_suggests_the_closest_names_first_and_lists_by_family():
    registry = Registry("attention", family=lambda name: name.split("-")[0])
    for name in ["oprf-fastfood", "oprf-fastfoodl", "oprf-orf", "posrf-orf", "softmax"]:
        registry.register(name)(object)
    with pytest.raises(ValueError, match="unknown attention") as info:
        registry.get("oprf-fastfod")
    first, *rest = str(info.value).splitlines()
    assert first == (
        "unknown attention 'oprf-fastfod'; did you mean 'oprf-fastfood', 'oprf-fastfoodl' or 'oprf-orf'?"
    )
    assert rest[0] == "known names by family:"
    assert "  oprf: oprf-fastfood, oprf-fastfoodl, oprf-orf" in rest
    assert "  softmax: softmax" in rest


def test_unknown_name_without_a_close_match_lists_all_names():
    registry = Registry("thing")
    registry.register("alpha")(int)
    message = registry.unknown_name_message("zzz")
    assert message.splitlines() == ["unknown thing 'zzz'", "known names:", "  alpha"]


def test_registry_lookup_ignores_case_and_passes_factories_through():
    registry = Registry("thing")
    registry.register("alpha")(int)
    assert registry.get("ALPHA") is int
    assert registry.get(float) is float
    assert "alpha" in registry
    assert registry.names("al*") == ["alpha"]


def test_unregister_removes_a_name_and_returns_its_factory():
    registry = Registry("thing")
    registry.register("alpha")(int)
    assert registry.unregister("Alpha") is int
    assert "alpha" not in registry
    registry.register("alpha")(float)  # the name is free again, without override
    assert registry.get("alpha") is float


def test_unregister_of_an_unknown_name_raises_the_unknown_name_error():
    registry = Registry("thing")
    registry.register("alpha")(int)
    with pytest.raises(ValueError, match="unknown thing 'alph'; did you mean 'alpha'"):
        registry.unregister("alph")


def test_markdown_table_pads_columns_and_checks_row_lengths():
    assert markdown_table(["a", "bb"], [["ccc", "d"]]).splitlines() == [
        "| a   | bb |",
        "| --- | -- |",
        "| ccc | d  |",
    ]
    with pytest.raises(ValueError, match=r"rows\[0\]: expected 2 cells"):
        markdown_table(["a", "b"], [["x"]])


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in {"cpu", "cuda"}
    with pytest.raises(ValueError, match="device: expected one of auto, cpu, cuda"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            resolve_device("cuda")


def test_check_int_takes_bounds_and_names_the_range():
    assert check_int("n", 5, 1, maximum=5) == 5
    with pytest.raises(ValueError, match=r"n: expected an integer in \[1, 4\], got 5"):
        check_int("n", 5, 1, maximum=4)
    with pytest.raises(ValueError, match=r"k: expected an integer <= 3, got 7"):
        check_int("k", 7, None, maximum=3)
    with pytest.raises(ValueError, match=r"k: expected an integer >= 1, got True"):
        check_int("k", True)
