"""Properties every registered weight matrix must have (the WeightMatrix contract of DESIGN.md)."""

import pytest
import torch

import rf_matrices
from spectraformer_core.testing import assert_rel_close, rounding_tolerance

ALL = ["base", "fastfood", "fastfoodl", "mm", "orf", "qmc", "sgq", "sorf"]
REDRAWN = [name for name in ALL if name != "fastfoodl"]


def second_moment(w: rf_matrices.WeightMatrix) -> torch.Tensor:
    """sum_i a_i w_i w_i^T with a_i the component weights (1/s for Monte Carlo matrices)."""
    m = w.matrix().double()
    a = w.component_weights
    a = torch.full((m.shape[0],), 1 / m.shape[0], dtype=m.dtype) if a is None else a.double()
    return m.T @ (m * a[:, None])


@pytest.mark.parametrize("name", ALL)
def test_forward_equals_x_times_matrix_transpose_in_float64(name):
    w = rf_matrices.create(name, 70, 12, seed=0, dtype=torch.float64)
    x = torch.randn(2, 3, 12, dtype=torch.float64)
    assert w(x).shape == (2, 3, w.num_features)
    assert w.matrix().shape == (w.num_features, 12)
    torch.testing.assert_close(w(x), x @ w.matrix().T)


@pytest.mark.parametrize("name", ALL)
def test_same_seed_gives_the_same_matrix_and_other_seeds_differ(name):
    a = rf_matrices.create(name, 40, 6, seed=7).matrix()
    b = rf_matrices.create(name, 40, 6, seed=7).matrix()
    c = rf_matrices.create(name, 40, 6, seed=8).matrix()
    g = rf_matrices.create(name, 40, 6, generator=torch.Generator().manual_seed(7)).matrix()
    assert torch.equal(a, b)
    assert torch.equal(a, g)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("name", ALL)
def test_float32_matrix_is_the_float64_draw_rounded(name):
    w64 = rf_matrices.create(name, 40, 6, seed=1, dtype=torch.float64).matrix()
    w32 = rf_matrices.create(name, 40, 6, seed=1, dtype=torch.float32).matrix()
    assert w32.dtype == torch.float32
    # drawn in float64 and rounded, or (SORF, FastFood) three Hadamard transforms of the padded dimension 8
    # computed in float32: 3 * 8 roundings at most
    assert_rel_close(name, w64, w32, rounding_tolerance(torch.float32, 3 * 8))


@pytest.mark.parametrize("name", REDRAWN)
def test_redraw_draws_afresh_and_a_seeded_redraw_reproduces_creation(name):
    w = rf_matrices.create(name, 40, 6, seed=3)
    first = w.matrix().clone()
    w.redraw()
    assert not torch.equal(w.matrix(), first)
    w.redraw(seed=3)
    torch.testing.assert_close(w.matrix(), first)


def test_learned_fastfood_is_not_redrawn():
    w = rf_matrices.create("fastfoodl", 40, 6, seed=3)
    first = w.matrix().clone()
    w.redraw()
    w.redraw(seed=4)
    assert torch.equal(w.matrix(), first)


@pytest.mark.parametrize("name", ALL)
def test_state_dict_round_trip_restores_the_matrix(name):
    saved = rf_matrices.create(name, 40, 6, seed=0)
    loaded = rf_matrices.create(name, 40, 6, seed=1)
    loaded.load_state_dict(saved.state_dict())
    assert torch.equal(loaded.matrix(), saved.matrix())


@pytest.mark.parametrize("name", REDRAWN)
def test_a_restored_matrix_redraws_as_the_saved_one(name):
    saved = rf_matrices.create(name, 40, 6, seed=0)
    saved.redraw()
    loaded = rf_matrices.create(name, 40, 6, seed=1)
    loaded.load_state_dict(saved.state_dict())
    saved.redraw()
    loaded.redraw()
    assert torch.equal(loaded.matrix(), saved.matrix())


@pytest.mark.parametrize("name", ALL)
def test_rows_have_second_moment_identity_over_sigma_squared_on_average(name):
    sigma, d = 2.0, 8
    w = rf_matrices.create(name, 48, d, sigma=sigma, seed=0, dtype=torch.float64)
    draws = 300 if w.redrawable else 1
    total = torch.zeros(d, d, dtype=torch.float64)
    for seed in range(draws):
        if w.redrawable:
            w.redraw(seed=seed)
        else:
            w = rf_matrices.create(name, 48, d, sigma=sigma, seed=seed, dtype=torch.float64)
        total += second_moment(w)
    if not w.redrawable:
        return  # fastfoodl draws like fastfood, checked there
    expected = torch.eye(d, dtype=torch.float64) / sigma**2
    torch.testing.assert_close(total / draws, expected, atol=0.03, rtol=0)


@pytest.mark.parametrize("name", ALL)
def test_trig_estimate_approximates_the_rbf_kernel_and_improves_with_features(name):
    d, sigma = 16, 1.5
    x = torch.randn(96, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x = x * sigma / d**0.5
    errors = []
    for s in (64, 256, 1024):
        runs = [
            rf_matrices.relative_kernel_error(
                rf_matrices.create(name, s, d, sigma=sigma, seed=seed, dtype=torch.float64), x, x
            )
            for seed in range(4)
        ]
        errors.append(sum(runs) / len(runs))
    assert errors[0] > errors[1] > errors[2], errors
    assert errors[2] < 0.1, errors


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_forward_is_finite_and_differentiable_in_low_precision(name, dtype):
    w = rf_matrices.create(name, 40, 12, seed=0, dtype=dtype)
    x = torch.randn(5, 12, dtype=dtype, requires_grad=True)
    y = w(x)
    assert y.dtype == dtype
    assert torch.isfinite(y).all()
    y.float().square().sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize(
    ("num_features", "dim", "message"),
    [
        (0, 4, "num_features: expected an integer >= 1, got 0"),
        (8, 0, "dim: expected"),
        (8, 2.5, "dim: expected an integer >= 1, got 2.5"),
    ],
)
def test_bad_sizes_name_the_argument(name, num_features, dim, message):
    with pytest.raises(ValueError, match=message):
        rf_matrices.create(name, num_features, dim)


@pytest.mark.parametrize("name", ALL)
def test_wrong_input_width_names_the_expected_dim(name):
    w = rf_matrices.create(name, 16, 6, seed=0)
    with pytest.raises(ValueError, match=r"x: expected last dimension 6 \(dim\), got shape \(3, 5\)"):
        w(torch.randn(3, 5))
    with pytest.raises(ValueError, match="x: expected a floating-point tensor"):
        w(torch.ones(3, 6, dtype=torch.long))


def test_seed_and_generator_together_are_refused():
    with pytest.raises(ValueError, match="seed, generator: pass at most one"):
        rf_matrices.create("base", 8, 4, seed=0, generator=torch.Generator())


def test_non_positive_sigma_is_refused():
    with pytest.raises(ValueError, match="sigma: expected a positive bandwidth, got 0"):
        rf_matrices.create("orf", 8, 4, sigma=0)


def test_unseeded_matrices_follow_torch_manual_seed():
    torch.manual_seed(11)
    a = rf_matrices.create("orf", 8, 4).matrix()
    torch.manual_seed(11)
    b = rf_matrices.create("orf", 8, 4).matrix()
    assert torch.equal(a, b)


@pytest.mark.parametrize("name", ALL)
def test_kept_values_follow_every_change_of_the_matrix(name):
    # row_sqnorms, and the dense W that structured matrices multiply by, are cached between calls
    w = rf_matrices.create(name, 40, 6, seed=0, dtype=torch.float64)
    x = torch.randn(5, 6, dtype=torch.float64)

    def check():
        torch.testing.assert_close(w.row_sqnorms(), w.matrix().pow(2).sum(-1))
        torch.testing.assert_close(w(x), x @ w.matrix().T)

    check()
    with torch.no_grad():
        first = w.row_sqnorms(torch.float32)
        assert w.row_sqnorms(torch.float32) is first  # kept while nothing changes
        assert first.dtype == torch.float32
        tensor = next(t for t in (*w.parameters(), *w.buffers()) if t.is_floating_point())
        tensor.mul_(2.0)  # an in-place update (an optimizer step, a load) bumps the version
        torch.testing.assert_close(w.row_sqnorms(torch.float32), w.matrix().float().pow(2).sum(-1))
        check()
    w.redraw(1)
    check()
    with torch.inference_mode():
        check()
    w.load_state_dict(rf_matrices.create(name, 40, 6, seed=3, dtype=torch.float64).state_dict())
    check()


def test_row_sqnorms_of_learned_entries_carry_their_gradient():
    w = rf_matrices.create("fastfoodl", 16, 6, seed=0, dtype=torch.float64)
    w.row_sqnorms().sum().backward()
    assert all(p.grad is not None for p in w.parameters())
    with torch.no_grad():
        assert not w.row_sqnorms().requires_grad
