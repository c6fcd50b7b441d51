"""Statistical properties of the feature maps: unbiasedness, the variance ordering, exact identities."""

import math

import pytest
import torch

import rf_features
from rf_features import gaussian_kernel, oprf_optimal_a, softmax_kernel

ESTIMATORS = {
    "trigrf": {},
    "posrf": {},
    "posrf-hyp": {},
    "gerf": {"a": -0.1},
    "gerf-trig": {"a": -0.1, "s": -1},
    "oprf": {},
    "saderf": {},
}


def make(name, matrix, num_features, dim, **kw):
    options = dict(ESTIMATORS[name], **kw)
    component = "gerf" if name.startswith("gerf") else name
    return rf_features.create(
        component,
        weight_matrix=matrix,
        num_features=num_features,
        dim=dim,
        seed=0,
        matrix_options={"dtype": torch.float64},
        **options,
    )


def small_inputs(dim=4, n=3):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, n, dim, generator=g, dtype=torch.float64) * 0.35
    k = torch.randn(2, n, dim, generator=g, dtype=torch.float64) * 0.35
    return q, k


@pytest.mark.parametrize("kernel", ["softmax", "gaussian"])
@pytest.mark.parametrize("matrix", ["base", "orf"])
@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_estimate_is_unbiased_over_redraws(name, matrix, kernel):
    q, k = small_inputs()
    fm = make(name, matrix, 1024, 4, kernel=kernel)
    draws = 25
    total = torch.zeros(2, 3, 3, dtype=torch.float64)
    squares = torch.zeros_like(total)
    for seed in range(draws):
        fm.redraw(seed=seed)
        phi_q, phi_k = fm(q, k)
        estimate = phi_q @ phi_k.mT
        total += estimate
        squares += estimate**2
    mean = total / draws
    standard_error = ((squares / draws - mean**2).clamp_min(0) / draws).sqrt()
    exact = softmax_kernel(q, k) if kernel == "softmax" else gaussian_kernel(q, k)
    # within 5 standard errors and 2% of the kernel value
    assert ((mean - exact).abs() <= 5 * standard_error + 0.02 * exact).all(), (mean - exact).abs().max()


def per_row_relative_mse(fm, q, k, exact):
    """Empirical relative MSE of the single-row estimator s * sum_l phi_q,il phi_k,il over the rows i."""
    phi_q, phi_k = fm(q, k)
    s = fm.weight_matrix.num_features
    products = (phi_q * phi_k).reshape(fm.features_per_row, s).sum(0) * s
    return float(((products - exact) ** 2).mean() / exact**2)


def test_variance_ordering_oprf_below_posrf_below_trigrf_as_q_plus_k_grows():
    # Likhosherstov et al. 2022: relative variances are cosh(||q - k||^2) - 1 for TrigRF,
    # exp(||q + k||^2) - 1 for PosRF, and smaller for OPRF, so with ||q - k|| = 3 fixed the ordering
    # holds while ||q + k||^2 stays below ||q - k||^2 - log 2 (small softmax values, most attention pairs).
    d = 8
    u = torch.zeros(d, dtype=torch.float64)
    v = torch.zeros(d, dtype=torch.float64)
    u[0], v[1] = 1.0, 1.0
    results = []
    for plus in (0.5, 1.0, 2.0):
        q = ((plus * u + 3.0 * v) / 2).reshape(1, 1, d)
        k = ((plus * u - 3.0 * v) / 2).reshape(1, 1, d)
        exact = float(softmax_kernel(q, k))
        mse = {
            name: per_row_relative_mse(
                rf_features.create(
                    name,
                    weight_matrix="base",
                    num_features=200_000,
                    dim=d,
                    seed=0,
                    matrix_options={"dtype": torch.float64},
                ),
                q,
                k,
                exact,
            )
            for name in ("oprf", "posrf", "trigrf")
        }
        assert mse["oprf"] <= mse["posrf"] <= mse["trigrf"], (plus, mse)
        results.append(mse)
    assert results[0]["posrf"] < results[1]["posrf"] < results[2]["posrf"]


def test_oprf_a_minimizes_the_second_moment_of_eq_21():
    d = 16
    for u in (0.1, 1.0, 5.0, 30.0):
        a_star = float(oprf_optimal_a(torch.tensor(u, dtype=torch.float64), d))

        def log_second_moment(a, u=u):
            return d * math.log(1 - 4 * a) - d / 2 * math.log(1 - 8 * a) + 2 * (1 - 4 * a) * u / (1 - 8 * a)

        for delta in (-1e-3, 1e-3):
            assert log_second_moment(a_star) <= log_second_moment(a_star + delta)
    assert float(oprf_optimal_a(torch.tensor(0.0), d)) == 0.0


@pytest.mark.filterwarnings("ignore:weight_matrix.*negative:UserWarning")
def test_quadrature_weights_enter_with_their_sign():
    d = 5
    q, k = small_inputs(dim=d)
    for name in ("posrf", "trigrf"):
        fm = rf_features.create(
            name,
            weight_matrix="sgq",
            num_features=2 * d + 1,
            dim=d,
            matrix_options={"dtype": torch.float64, "rule": "smolyak", "rotate": False},
        )
        a = fm.weight_matrix.component_weights
        assert a[0].item() == pytest.approx(1 - d / 3)  # negative
        omega = fm.weight_matrix.matrix()
        pq, pk = q @ omega.T, k @ omega.T
        if name == "posrf":
            f_q = torch.exp(pq - q.pow(2).sum(-1, keepdim=True) / 2)
            f_k = torch.exp(pk - k.pow(2).sum(-1, keepdim=True) / 2)
            expected = (f_q * a) @ f_k.mT
        else:
            scale = torch.exp(q.pow(2).sum(-1, keepdim=True) / 2 + k.pow(2).sum(-1).unsqueeze(-2) / 2)
            expected = scale * (
                (torch.cos(pq) * a) @ torch.cos(pk).mT + (torch.sin(pq) * a) @ torch.sin(pk).mT
            )
        phi_q, phi_k = fm(q, k)
        torch.testing.assert_close(phi_q @ phi_k.mT, expected)


@pytest.mark.parametrize("name", rf_features.names())
def test_stabilize_leaves_normalized_attention_weights_unchanged(name):
    q, k = small_inputs(dim=6, n=5)
    q, k = q * 4, k * 4
    fm = rf_features.create(
        name, weight_matrix="orf", num_features=32, dim=6, seed=0, matrix_options={"dtype": torch.float64}
    )

    def weights(stabilize):
        phi_q, phi_k = fm(q, k, stabilize=stabilize)
        scores = phi_q @ phi_k.mT
        return scores / scores.sum(-1, keepdim=True)

    torch.testing.assert_close(weights(True), weights(False))


@pytest.mark.parametrize("name", rf_features.names())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_stabilized_features_are_finite_for_norms_up_to_10(name, dtype):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 16, 32, generator=g)
    k = torch.randn(2, 2, 16, 32, generator=g)
    q = (q / q.norm(dim=-1, keepdim=True) * torch.linspace(0.1, 10, 16)[:, None]).to(dtype)
    k = (k / k.norm(dim=-1, keepdim=True) * torch.linspace(10, 0.1, 16)[:, None]).to(dtype)
    fm = rf_features.create(name, weight_matrix="orf", num_features=64, dim=32, seed=0)
    phi_q, phi_k = fm(q, k, stabilize=True)
    assert phi_q.dtype == dtype
    assert torch.isfinite(phi_q).all()
    assert torch.isfinite(phi_k).all()
    assert torch.isfinite(phi_q.float() @ phi_k.float().mT).all()


def all_pairs_objective(log_psi, q, k):
    """``sum_{i,j} ||Psi q_i + Psi^-1 k_j||^2`` over every pair of the given queries and keys."""
    psi = log_psi.exp()
    return ((q * psi)[:, None, :] + (k / psi)[None, :, :]).pow(2).sum()


def test_saderf_psi_is_the_all_pairs_optimum_with_masks_and_unequal_lengths():
    g = torch.Generator().manual_seed(0)
    d = 6
    q = torch.randn(2, 5, d, generator=g, dtype=torch.float64) * torch.linspace(0.2, 2.0, d)
    k = torch.randn(2, 9, d, generator=g, dtype=torch.float64) * torch.linspace(3.0, 0.5, d)
    query_mask = torch.tensor([[False, False, False, True, True], [False] * 5])
    key_mask = torch.tensor([[False] * 9, [False] * 2 + [True] * 7])
    psi = rf_features.saderf_psi(q, k, query_mask, key_mask)
    for b in range(2):
        kept_q, kept_k = q[b][~query_mask[b]], k[b][~key_mask[b]]
        log_psi = torch.zeros(d, dtype=torch.float64, requires_grad=True)
        optimizer = torch.optim.LBFGS(
            [log_psi], max_iter=200, tolerance_grad=1e-12, line_search_fn="strong_wolfe"
        )

        def closure(kept_q=kept_q, kept_k=kept_k, log_psi=log_psi, optimizer=optimizer):
            optimizer.zero_grad()
            loss = all_pairs_objective(log_psi, kept_q, kept_k)
            loss.backward()
            return loss

        optimizer.step(closure)
        torch.testing.assert_close(psi[b], log_psi.detach().exp(), rtol=1e-6, atol=0)


@pytest.mark.parametrize(("s", "a"), [(1, -0.05 + 0.04j), (1, -0.1), (-1, 0.02 - 0.03j), (-1, 0.0)])
def test_gerf_relative_variance_matches_sampling_for_real_and_complex_a(s, a):
    d, n = 4, 400_000
    g = torch.Generator().manual_seed(0)
    x = torch.tensor([0.3, -0.2, 0.1, 0.25], dtype=torch.float64)
    y = torch.tensor([0.1, 0.3, -0.2, 0.05], dtype=torch.float64)
    omega = torch.randn(n, d, generator=g, dtype=torch.float64)
    big_a = torch.tensor(a, dtype=torch.complex128)
    big_b = torch.sqrt(s * (1 - 4 * big_a))
    big_d = (1 - 4 * big_a) ** (d / 4)
    c = -(s + 1) / 2
    r = omega.pow(2).sum(-1)
    f1 = big_d * torch.exp(big_a * r + big_b * (omega @ x) + c * x.pow(2).sum())
    f2 = big_d * torch.exp(big_a * r + s * big_b * (omega @ y) + c * y.pow(2).sum())
    z = (f1 * f2).real
    exact = math.exp(-(x - y).pow(2).sum().item() / 2)  # Eq. 21 estimates the Gaussian kernel
    assert z.mean().item() == pytest.approx(exact, rel=0.02)
    sampled = (z.pow(2).mean() / exact**2 - 1).item()
    u = (x + s * y).pow(2).sum().item()
    assert rf_features.gerf_relative_variance(a, s, d, u) == pytest.approx(sampled, rel=0.05)


@pytest.mark.parametrize("s", [1, -1])
@pytest.mark.parametrize(("d", "u"), [(4, 0.5), (4, 8.0), (32, 2.0), (32, 30.0)])
def test_no_complex_a_has_lower_gerf_variance_than_the_best_real_a(s, d, u):
    # The reason GERF and OPRF take a real A: over a grid of complex A the variance is lowest on Im A = 0.
    real_parts = torch.linspace(-3.0, 0.124, 400).tolist()
    best_real = min(rf_features.gerf_relative_variance(a, s, d, u) for a in real_parts)
    for a in real_parts[::8]:
        for imag in (-1.0, -0.3, -0.1, -0.03, -0.01, 0.01, 0.03, 0.1, 0.3, 1.0):
            assert rf_features.gerf_relative_variance(complex(a, imag), s, d, u) >= best_real * (1 - 1e-9)
    if s == 1:
        a_star = float(oprf_optimal_a(torch.tensor(u, dtype=torch.float64), d))
        assert rf_features.gerf_relative_variance(a_star, s, d, u) <= best_real * (1 + 1e-9)
