"""`relative_error`, `assert_rel_close`, `seeded_randn` and `torch_threads`: what the tests share."""

import math

import pytest
import torch

from spectraformer_core.testing import assert_rel_close, relative_error, seeded_randn, torch_threads

REFERENCE = torch.tensor([[3.0, 0.0], [0.0, 4.0]], dtype=torch.float64)  # norm 5
OFF_BY_A_TENTH = REFERENCE + torch.tensor([[0.0, 0.3], [0.4, 0.0]], dtype=torch.float64)  # norm 0.5 off


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
