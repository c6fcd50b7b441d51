"""ralimp.analysis: the closed forms against Monte Carlo where Monte Carlo can see them (2 sigma^2 < ~6)."""

import math

import pytest
import torch
import torch.nn.functional as F

import ralimp
from ralimp import analysis
from ralimp.features import complex_exponential_features, product_features
from spectraformer_core.testing import relative_error


def test_node_variance_with_both_channels_matches_monte_carlo():
    gen = torch.Generator().manual_seed(0)
    x = torch.tensor([[0.4, -0.3, 0.5]], dtype=torch.float64)
    w = torch.tensor([[0.2, 0.6, -0.1]], dtype=torch.float64)
    s, w_c, w_s, rows, draws = 1.3, 0.7, -0.4, 4, 200_000
    two_sigma2 = s * float((x + w).pow(2).sum())
    assert 0.5 < two_sigma2 < 2  # where 2e5 draws see the whole distribution
    omega = torch.randn(draws, rows, 3, generator=gen, dtype=torch.float64)
    freq = torch.full((rows,), s, dtype=torch.float64)
    xr, xi = complex_exponential_features(x.expand(draws, 1, 3), omega, freq)
    wr, wi = complex_exponential_features(w.expand(draws, 1, 3), omega, freq)
    c = (xr * wr - xi * wi).mean(-1).squeeze(-1)
    sn = (xr * wi + xi * wr).mean(-1).squeeze(-1)
    sample = w_c * c + w_s * sn
    exact = math.exp(float(analysis.node_log_variance(x, w, torch.tensor(s), w_c, w_s, rows)))
    assert float(sample.var()) == pytest.approx(exact, rel=0.05)
    assert float(sample.mean()) == pytest.approx(
        w_c * math.cos(s * float(x @ w.T)) + w_s * math.sin(s * float(x @ w.T)),
        abs=4 * math.sqrt(exact / draws),
    )


def test_product_block_variance_with_shared_projections_matches_monte_carlo():
    gen = torch.Generator().manual_seed(1)
    x = torch.tensor([[0.5, -0.4, 0.3, 1.0]], dtype=torch.float64)
    w = torch.tensor([[0.3, 0.2, -0.6, 0.1]], dtype=torch.float64)
    coef = torch.tensor([0.1, 0.5, 0.3, -0.2], dtype=torch.float64)
    rows, draws = 3, 100_000
    mats = [torch.randn(draws, rows, 4, generator=gen, dtype=torch.float64) for _ in range(3)]
    fx = product_features(x.expand(draws, 1, 4), mats)
    fw = product_features(w.expand(draws, 1, 4), mats)
    sample = sum(coef[n] * (fx[n - 1] * fw[n - 1]).mean(-1).squeeze(-1) for n in range(1, 4))
    exact = float(analysis.product_block_variance(coef, x, w, rows))
    assert float(sample.var()) == pytest.approx(exact, rel=0.05)


def test_ralimp_layer_variance_matches_the_spread_over_projection_draws():
    # One layer with draws * m rows per projection is draws independent layers of m rows: row r of every
    # matrix belongs to group r // m, and each group's share of Psi(W) Phi(x) (times draws) is one layer's.
    gen = torch.Generator().manual_seed(2)
    linear = torch.nn.Linear(3, 2, dtype=torch.float64)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(2, 3, generator=gen, dtype=torch.float64) * 0.3)
        linear.bias.copy_(torch.tensor([0.1, -0.2], dtype=torch.float64))
    x = torch.randn(3, 3, generator=gen, dtype=torch.float64) * 0.3
    m, draws = 2, 20_000
    layer = ralimp.RaLiMP.from_linear(
        linear,
        "gelu",
        poly_features=m * draws,
        freq_features=m * draws,
        seed=0,
        fit="discretized",
        interval=(-4.0, 4.0),
    )
    with torch.no_grad():
        phi, psi = layer.feature_map(x)[:, 1:], layer.weight_features()[:, 1:]
        group = (torch.arange(phi.shape[-1]) % (m * draws)) // m
        shares = torch.zeros(3, 2, draws, dtype=torch.float64)
        shares.index_add_(-1, group, phi.unsqueeze(1) * psi.unsqueeze(0))
        outputs = layer.poly_coef[0] + draws * shares
        torch.testing.assert_close(outputs.mean(-1), layer(x))
        small = ralimp.RaLiMP.from_linear(
            linear, "gelu", poly_features=m, freq_features=m, seed=0, fit="discretized", interval=(-4.0, 4.0)
        )
        exact = analysis.ralimp_log_variance(small, x).exp()
        t = linear(x)
        torch.testing.assert_close(outputs.var(-1), exact, rtol=0.1, atol=0)
        mean_error = (outputs.mean(-1) - small.expected_output(t)).abs()
    assert bool((mean_error < 4 * (exact / draws).sqrt()).all())


def test_eugen_variance_matches_the_spread_over_projection_draws():
    gen = torch.Generator().manual_seed(3)
    linear = torch.nn.Linear(3, 2, dtype=torch.float64)
    x = torch.randn(3, 3, generator=gen, dtype=torch.float64) * 0.5
    layer = ralimp.EUGen.from_linear(linear, "gelu", num_features=3, seed=0)
    outputs = []
    with torch.no_grad():
        for seed in range(6000):
            for index, mat in enumerate(layer.matrices):
                mat.redraw(seed=seed * 10 + index)
            layer.load_linear(linear.weight, linear.bias)
            outputs.append(layer(x))
    exact = analysis.eugen_variance(layer, linear, x)
    torch.testing.assert_close(torch.stack(outputs).var(0), exact, rtol=0.1, atol=0)


def test_the_bound_holds_for_every_balance_and_tau():
    gen = torch.Generator().manual_seed(4)
    a = torch.randn(200, 64, generator=gen, dtype=torch.float64)
    b = torch.randn(200, 64, generator=gen, dtype=torch.float64) / 8
    t = (a * b).sum(-1)
    cos = t / (a.norm(dim=-1) * b.norm(dim=-1))
    s_k, q = 2.29, 1.7
    bound = analysis.log_second_moment_bound(s_k, t, q, cos)
    for lam in (0.3, 1.0, 2.8, 10.0):
        for tau in (0.5, 1.0, 3.0):
            # q' = q / tau^2 in the layer's units: 2 sigma^2 = (s_k / q') ||a / (lam tau) + lam b / tau||^2
            two_sigma2 = s_k / (q / tau**2) * (a / (lam * tau) + lam * b / tau).pow(2).sum(-1)
            assert bool((two_sigma2 >= bound - 1e-9).all())
    # tight: at the best balance and t < 0 the bound is attained
    best = (a.norm(dim=-1) / b.norm(dim=-1)).sqrt()
    two_sigma2 = s_k / q * (a / best[:, None] + best[:, None] * b).pow(2).sum(-1)
    negative = t < 0
    torch.testing.assert_close(two_sigma2[negative], bound[negative])


def test_variance_rejects_orthogonal_rows_and_fitted_readouts():
    linear = torch.nn.Linear(3, 2, dtype=torch.float64)
    x = torch.randn(4, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"weight_matrix: the closed forms assume i\.i\.d\. N"):
        analysis.ralimp_log_variance(
            ralimp.RaLiMP.from_linear(linear, "gelu", weight_matrix="orf", seed=0), x
        )
    fitted = ralimp.RaLiMP.from_linear(linear, "gelu", sample=x.repeat(50, 1), init="lstsq", seed=0)
    with pytest.raises(ValueError, match="layer: has a fitted readout"):
        analysis.ralimp_log_variance(fitted, x)


def test_the_variance_aware_fit_of_a_small_layer_at_a_large_budget_has_a_small_expected_error():
    # bias^2 + exact variance over the projections (not a sample of draws, which misses log-normal tails)
    torch.manual_seed(0)
    linear = torch.nn.Linear(16, 24, dtype=torch.float64)
    x = torch.randn(2048, 16, dtype=torch.float64)
    t = linear(x).detach()
    errors = {}
    for fit in ("variance", "discretized"):
        layer = ralimp.RaLiMP.from_linear(
            linear, "gelu", poly_features=512, freq_features=256, seed=0, fit=fit
        )
        with torch.no_grad():
            mean = layer.expected_output(t)
            errors[fit] = analysis.expected_relative_mse(
                mean, analysis.ralimp_log_variance(layer, x), torch.nn.functional.gelu(t)
            )
    assert errors["variance"] < 0.1
    assert errors["variance"] < errors["discretized"]


def test_a_least_squares_readout_on_the_variance_aware_features_generalizes():
    # unit-norm rows, N(0, I) inputs; relative MSE on inputs not used for the readout
    gen = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(64, 64)
    with torch.no_grad():
        linear.weight.copy_(F.normalize(torch.randn(64, 64, generator=gen), dim=-1))
        linear.bias.zero_()
    train, test = torch.randn(4096, 64, generator=gen), torch.randn(2048, 64, generator=gen)
    layer = ralimp.create("ralimp", linear, "gelu", budget=64, sample=train, init="lstsq", seed=0)
    with torch.no_grad():
        target = F.gelu(linear(test))
        error = relative_error(layer(test), target) ** 2
    assert error < 1.0


def _draws_of(layer, x, m, draws):
    """``(N, l, draws)``: the outputs of ``draws`` independent layers of ``m`` rows packed into ``layer``."""
    with torch.no_grad():
        phi, psi = layer.feature_map(x)[:, 1:], layer.weight_features()[:, 1:]
        group = (torch.arange(phi.shape[-1]) % (m * draws)) // m
        shares = torch.zeros(x.shape[0], psi.shape[0], draws, dtype=torch.float64)
        shares.index_add_(-1, group, phi.unsqueeze(1) * psi.unsqueeze(0))
        return layer.poly_coef[0] + draws * shares


@pytest.mark.parametrize("atoms", [0, 1])
def test_atom_tradeoff_bias_and_variance_match_monte_carlo_over_projection_draws(atoms):
    # budget 12 = 4 polynomial rows + 2 x 1 node x 4 rows with the atom, 12 polynomial rows without
    gen = torch.Generator().manual_seed(5)
    linear = torch.nn.Linear(3, 2, dtype=torch.float64)
    with torch.no_grad():
        linear.weight.copy_(F.normalize(torch.randn(2, 3, generator=gen, dtype=torch.float64), dim=-1) / 2)
        linear.bias.zero_()
    x = F.normalize(torch.randn(6, 3, generator=gen, dtype=torch.float64), dim=-1) / 2
    options = {"sample": x, "num_freqs": 1, "fit": "discretized"}
    layer = ralimp.create("ralimp", linear, "gelu", budget=12, freq_features=4, seed=0, **options)
    row = next(r for r in analysis.atom_tradeoff(layer) if (r["atoms"], r["fit"]) == (atoms, "discretized"))
    m, draws = (4, 20_000) if atoms else (12, 20_000)
    sizes = (
        {"poly_features": m * draws, "freq_features": m * draws} if atoms else {"poly_features": m * draws}
    )
    big = ralimp.RaLiMP.from_linear(linear, "gelu", num_atoms=atoms, seed=1, **sizes, **options)
    outputs, t = _draws_of(big, x, m, draws), linear(x).detach()
    target = F.gelu(t)
    with torch.no_grad():
        expected = big.expected_output(t)
    assert float((expected - target).pow(2).mean()) == pytest.approx(row["bias2"], rel=1e-6)
    assert row["signal"] == pytest.approx(float(target.pow(2).mean()), rel=1e-6)
    # the atom's estimator is log-normal: a sample sees little of its tail and falls a little short
    low = 0.85 if atoms else 0.98
    sampled = float(outputs.var(-1).mean()) / row["variance"]
    total = float((outputs - target.unsqueeze(-1)).pow(2).mean()) / row["total"]
    assert low < sampled < 1.02
    assert low < total < 1.02


def _tradeoff():
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 8)
    layer = ralimp.create("ralimp", linear, "tanh", budget=32, sample=torch.randn(128, 4), seed=0)
    return layer, {(r["atoms"], r["fit"]): r for r in analysis.atom_tradeoff(layer)}


def test_the_variance_aware_fit_has_the_least_expected_error_and_an_atom_lowers_the_least_squares_bias():
    _, rows = _tradeoff()
    assert rows[0, "variance"]["total"] <= rows[0, "discretized"]["total"] * (1 + 1e-9)
    assert rows[1, "discretized"]["bias2"] < rows[0, "discretized"]["bias2"]
    assert all(row["variance"] >= -1e-12 for row in rows.values())


def test_the_atoms_table_reports_the_choice_the_variance_aware_fit_made():
    layer, rows = _tradeoff()
    table = analysis.atoms_table([("block", layer)]).splitlines()
    assert [c.strip() for c in table[0].strip("|").split("|")] == list(analysis.ATOM_COLUMNS)
    cells = [c.strip() for c in table[2].strip("|").split("|")]
    assert cells[0] == "block"
    assert int(cells[-1]) == layer.num_atoms
    assert float(cells[3]) == pytest.approx(
        rows[0, "discretized"]["bias2"] - rows[1, "discretized"]["bias2"], rel=0.05
    )


def test_the_spread_of_an_exact_replacement_is_zero_and_a_random_one_is_not():
    torch.manual_seed(0)
    linear, x = torch.nn.Linear(4, 8), torch.randn(64, 4)
    assert analysis.relative_spread(linear, "tanh", x, "dense", budget=None, seeds=2) < 1e-6
    assert analysis.relative_spread(linear, "tanh", x, "eugen", budget=8, seeds=2) > 1e-3
