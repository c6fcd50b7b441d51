"""QMC (Section 3.1.5), MM (Section 3.1.6) and SGQ (Section 3.1.7)."""

import itertools
import math

import pytest
import torch

import rf_matrices
from rf_matrices import gauss_hermite, smolyak_gauss_hermite


def l2_star_discrepancy(t: torch.Tensor) -> float:
    """Warnock's closed form of the L2 star discrepancy of points t (n, d) in [0, 1]^d."""
    n, d = t.shape
    term1 = 3.0**-d
    term2 = (1 - t.pow(2)).prod(dim=1).sum() * 2 ** (1 - d) / n
    term3 = (1 - torch.maximum(t[:, None], t[None])).prod(dim=2).sum() / n**2
    return math.sqrt(term1 - term2 + term3)


def test_qmc_points_have_lower_discrepancy_than_iid_draws():
    n, d = 256, 4
    qmc, iid = [], []
    for seed in range(5):
        w = rf_matrices.create("qmc", n, d, seed=seed, dtype=torch.float64).matrix()
        qmc.append(l2_star_discrepancy(torch.special.ndtr(w)))
        iid.append(l2_star_discrepancy(torch.rand(n, d, dtype=torch.float64)))
    assert max(qmc) < min(iid)
    assert sum(qmc) / 5 < 0.5 * sum(iid) / 5


def test_qmc_has_no_infinite_entries():
    for seed in range(10):
        w = rf_matrices.create("qmc", 4096, 3, seed=seed, dtype=torch.float64).matrix()
        assert torch.isfinite(w).all()


def test_qmc_rows_are_scaled_by_one_over_sigma():
    one = rf_matrices.create("qmc", 64, 5, seed=0, dtype=torch.float64).matrix()
    two = rf_matrices.create("qmc", 64, 5, sigma=2.0, seed=0, dtype=torch.float64).matrix()
    torch.testing.assert_close(two, one / 2)


def test_mm_sample_moments_are_exact():
    sigma = 1.7
    w = rf_matrices.create("mm", 100, 12, sigma=sigma, seed=0, dtype=torch.float64).matrix()
    torch.testing.assert_close(w.mean(dim=0), torch.zeros(12, dtype=torch.float64))
    expected = torch.eye(12, dtype=torch.float64) / sigma**2
    torch.testing.assert_close(w.T @ w / 100, expected)


def test_mm_with_fewer_rows_than_dims_matches_mean_and_variances():
    w = rf_matrices.create("mm", 6, 10, seed=0, dtype=torch.float64).matrix()
    torch.testing.assert_close(w.mean(dim=0), torch.zeros(10, dtype=torch.float64))
    torch.testing.assert_close(w.pow(2).mean(dim=0), torch.ones(10, dtype=torch.float64))
    with pytest.raises(ValueError, match="num_features: mm needs at least 2 rows"):
        rf_matrices.create("mm", 1, 10)


def gaussian_moment(powers: tuple[int, ...]) -> float:
    """E[prod x_i^k_i] under N(0, I): product of (k - 1)!! for even k, 0 if any k is odd."""
    out = 1.0
    for k in powers:
        if k % 2:
            return 0.0
        out *= math.prod(range(k - 1, 0, -2))
    return out


def monomials(dim: int, degree: int):
    for total in range(degree + 1):
        for combo in itertools.combinations_with_replacement(range(dim), total):
            yield tuple(combo.count(i) for i in range(dim))


def quadrature(points: torch.Tensor, weights: torch.Tensor, powers: tuple[int, ...]) -> float:
    values = torch.ones(len(points), dtype=torch.float64)
    for i, k in enumerate(powers):
        values = values * points[:, i] ** k
    return float(weights @ values)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_gauss_hermite_integrates_polynomials_up_to_degree_2n_minus_1(n):
    nodes, weights = gauss_hermite(n)
    for k in range(2 * n):
        exact = gaussian_moment((k,))
        assert quadrature(nodes[:, None], weights, (k,)) == pytest.approx(exact, rel=1e-10, abs=1e-8)


def test_degree_3_sparse_grid_is_the_papers_rule():
    d = 5
    points, weights = smolyak_gauss_hermite(d, 3)
    assert len(points) == 2 * d + 1
    origin = points.abs().sum(dim=1) == 0
    assert weights[origin].item() == pytest.approx(1 - d / 3)
    torch.testing.assert_close(weights[~origin], torch.full((2 * d,), 1 / 6, dtype=torch.float64))
    torch.testing.assert_close(
        points[~origin].abs().sum(dim=1), torch.full((2 * d,), math.sqrt(3), dtype=torch.float64)
    )


@pytest.mark.parametrize(("dim", "degree"), [(1, 3), (4, 3), (6, 5), (3, 7)])
def test_sparse_grid_integrates_every_polynomial_of_its_degree_exactly(dim, degree):
    points, weights = smolyak_gauss_hermite(dim, degree)
    for powers in monomials(dim, degree):
        assert quadrature(points, weights, powers) == pytest.approx(gaussian_moment(powers), abs=1e-10), (
            powers
        )


@pytest.mark.parametrize(
    "options",
    [{}, {"radius": "fixed"}, {"radius": "fixed", "rotate": False}],
    ids=["random-radius", "fixed-radius", "axis-aligned"],
)
def test_sgq_weight_matrix_integrates_every_polynomial_of_degree_3_exactly(options):
    d = 5
    s = 2 * d + 1 if options.get("rotate") is False else 64
    w = rf_matrices.create("sgq", s, d, seed=0, dtype=torch.float64, **options)
    points, weights = w.matrix(), w.component_weights
    assert weights.sum().item() == pytest.approx(1.0)
    for powers in monomials(d, 3):
        assert quadrature(points, weights, powers) == pytest.approx(gaussian_moment(powers), abs=1e-10), (
            powers
        )


def test_sgq_reports_the_feature_count_it_uses():
    w = rf_matrices.create("sgq", 128, 16, seed=0)
    assert (w.requested_features, w.copies, w.num_features) == (128, 4, 129)
    assert w.matrix().shape == (129, 16)
    assert w.component_weights.shape == (129,)
    assert rf_matrices.create("sgq", 5, 16, seed=0).num_features == 33


def test_sgq_origin_weight_is_negative_in_high_dimension():
    w = rf_matrices.create("sgq", 33, 16, seed=0, radius="fixed")
    assert w.component_weights[0].item() == pytest.approx(1 - 16 / 3)


def test_sgq_refuses_identical_copies():
    with pytest.raises(ValueError, match="num_features: 64 needs 6 copies"):
        rf_matrices.create("sgq", 64, 5, rotate=False, radius="fixed")
    with pytest.raises(ValueError, match="radius: expected 'random' or 'fixed'"):
        rf_matrices.create("sgq", 64, 5, radius="big")
    with pytest.raises(ValueError, match="degree: radius='random' needs degree=3"):
        rf_matrices.create("sgq", 64, 5, degree=5)
