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


def rule_weights(w):
    """The weights of a weight matrix's rule: its component weights, or 1/s each."""
    a = w.component_weights
    return torch.full((w.num_features,), 1 / w.num_features, dtype=torch.float64) if a is None else a


SYMMETRIC_RULES = {
    "stiefel-antipodal": ({"antipodal": True}, 23),
    "stiefel-antipodal-2d": ({"antipodal": True}, 10),
    "spherical-radial": ({"rule": "spherical-radial"}, 31),
    "smolyak-rotated": ({"rule": "smolyak"}, 31),
    "smolyak-paper": ({"rule": "smolyak", "rotate": False}, 11),
}


@pytest.mark.parametrize(("options", "s"), list(SYMMETRIC_RULES.values()), ids=list(SYMMETRIC_RULES))
def test_sgq_rule_integrates_every_polynomial_of_degree_3_exactly(options, s):
    d = 5
    w = rf_matrices.create("sgq", s, d, seed=0, dtype=torch.float64, **options)
    points, weights = w.matrix(), rule_weights(w)
    assert points.shape == (s, d)
    assert weights.sum().item() == pytest.approx(1.0)
    for powers in monomials(d, 3):
        assert quadrature(points, weights, powers) == pytest.approx(gaussian_moment(powers), abs=1e-10), (
            powers
        )


@pytest.mark.parametrize("s", [5, 12, 33])
def test_folded_stiefel_rule_integrates_every_even_polynomial_of_degree_3_exactly(s):
    # One node per antipodal pair: for integrands even in omega it is the antipodal rule of 2s nodes.
    d = 5
    w = rf_matrices.create("sgq", s, d, seed=1, dtype=torch.float64)
    points, weights = w.matrix(), rule_weights(w)
    symmetrized_points, symmetrized_weights = torch.cat((points, -points)), torch.cat((weights, weights)) / 2
    for powers in monomials(d, 3):
        if sum(powers) % 2 == 0:
            assert quadrature(points, weights, powers) == pytest.approx(gaussian_moment(powers), abs=1e-10)
        assert quadrature(symmetrized_points, symmetrized_weights, powers) == pytest.approx(
            gaussian_moment(powers), abs=1e-10
        )


def test_stiefel_rule_with_2d_nodes_is_the_rotated_2d_point_rule():
    d = 6
    w = rf_matrices.create("sgq", 2 * d, d, seed=0, antipodal=True, dtype=torch.float64).matrix()
    torch.testing.assert_close(w[:d], -w[d:])
    torch.testing.assert_close(w[:d] @ w[:d].T, d * torch.eye(d, dtype=torch.float64))  # +-sqrt(d) R e_i


@pytest.mark.parametrize("antipodal", [False, True])
def test_stiefel_rule_has_equal_positive_weights_and_exact_second_moment(antipodal):
    for s, d in ((16, 8), (37, 16), (128, 32)):
        w = rf_matrices.create("sgq", s, d, seed=0, antipodal=antipodal, dtype=torch.float64)
        assert w.component_weights is None
        assert not w.signed_weights
        torch.testing.assert_close(w.matrix().T @ w.matrix() / s, torch.eye(d, dtype=torch.float64))


@pytest.mark.parametrize(
    "options", [{}, {"antipodal": True}, {"rule": "spherical-radial"}, {"rule": "smolyak"}], ids=str
)
def test_sgq_has_exactly_the_requested_number_of_rows(options):
    d = 16
    for s in (33, 65, 129):
        w = rf_matrices.create("sgq", s, d, seed=0, **options)
        assert w.num_features == s
        assert w.matrix().shape == (s, d)
        assert w.component_weights is None or w.component_weights.shape == (s,)


def test_sgq_refuses_a_count_its_rule_cannot_have_and_names_the_nearest_valid_counts():
    with pytest.raises(
        ValueError, match=r"num_features: .*antipodal=True and dim=16 .* got 16; .* count: 32"
    ):
        rf_matrices.create("sgq", 16, 16, antipodal=True)
    with pytest.raises(
        ValueError, match=r"num_features: .*antipodal=False and dim=16 .* got 8; .* count: 16"
    ):
        rf_matrices.create("sgq", 8, 16)
    with pytest.raises(
        ValueError, match=r"rule='smolyak', degree=3 and dim=16 .* got 128; .* counts: 97, 129"
    ):
        rf_matrices.create("sgq", 128, 16, rule="smolyak")
    with pytest.raises(ValueError, match=r"rule='spherical-radial' .* got 5; nearest valid count: 33$"):
        rf_matrices.create("sgq", 5, 16, rule="spherical-radial")


def test_sgq_signed_rules_say_so_and_the_papers_origin_weight_is_negative():
    w = rf_matrices.create("sgq", 33, 16, rule="smolyak", rotate=False)
    assert w.signed_weights
    assert w.component_weights[0].item() == pytest.approx(1 - 16 / 3)
    assert rf_matrices.create("sgq", 33, 16, rule="spherical-radial").signed_weights
    assert not rf_matrices.create("sgq", 7, 3, rule="smolyak").signed_weights  # 1 - d/3 = 0 at d = 3


def test_sgq_refuses_options_its_rule_does_not_have():
    with pytest.raises(ValueError, match="rotate: num_features=21 needs 2 copies"):
        rf_matrices.create("sgq", 21, 5, rule="smolyak", rotate=False)
    with pytest.raises(ValueError, match="rule: expected one of"):
        rf_matrices.create("sgq", 64, 5, rule="big")
    with pytest.raises(ValueError, match="degree: rule='stiefel' is a degree-3 rule"):
        rf_matrices.create("sgq", 64, 5, degree=5)
    with pytest.raises(ValueError, match="antipodal: only rule='stiefel'"):
        rf_matrices.create("sgq", 31, 5, rule="smolyak", antipodal=True)
    with pytest.raises(ValueError, match="rotate: rule='stiefel' is random"):
        rf_matrices.create("sgq", 31, 5, rotate=False)


def trig_mean_squared_error(name, s, d, distance, seeds, **kw):
    """Mean over seeds of mean((K_hat - K)^2) of the TrigRF RBF estimate, ||x - y|| ~ distance."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, d, generator=g, dtype=torch.float64) * distance / (2 * d) ** 0.5
    exact = rf_matrices.gaussian_kernel(x, x)
    errors = [
        (
            rf_matrices.trig_kernel_estimate(
                rf_matrices.create(name, s, d, seed=seed, dtype=torch.float64, **kw), x, x
            )
            - exact
        )
        .pow(2)
        .mean()
        for seed in range(seeds)
    ]
    return float(torch.stack(errors).mean())


@pytest.mark.parametrize(("d", "s"), [(16, 16), (16, 64), (16, 256), (4, 64), (64, 128)])
def test_sgq_default_is_at_least_as_accurate_as_iid_gaussian_rows_at_equal_count(d, s):
    sgq = trig_mean_squared_error("sgq", s, d, 2.0, seeds=20)
    base = trig_mean_squared_error("base", s, d, 2.0, seeds=20)
    assert sgq <= base, (sgq, base)


@pytest.mark.parametrize(("even", "antipodal"), [(True, False), (False, True)])
def test_create_picks_the_stiefel_form_from_the_integrands_symmetry(even, antipodal):
    assert rf_matrices.create("sgq", 16, 8, seed=0, even_in_omega=even).antipodal is antipodal
    # an explicit choice and the other rules are left alone
    assert rf_matrices.create("sgq", 16, 8, seed=0, even_in_omega=even, antipodal=False).antipodal is False
    assert rf_matrices.create("sgq", 17, 8, seed=0, even_in_omega=even, rule="spherical-radial").copies == 1
    assert rf_matrices.create("orf", 16, 8, seed=0, even_in_omega=even).num_features == 16
