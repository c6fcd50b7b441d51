"""ralimp.paper_checks and ralimp.guard_off against plain float64 references."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import ralimp
from ralimp import guard_off, paper_checks
from ralimp.layer import RaLiMP
from ralimp.quadrature import gauss_laguerre


def laplace_integral(rho_c, rho_s, u):
    """int_0^60 e^{-s} (rho_c(s) cos su + rho_s(s) sin su) ds by the trapezoid rule (the tail is < e^-50)."""
    s = np.linspace(0.0, 60.0, 600_001)
    poly_c = np.polynomial.polynomial.polyval(s, rho_c)
    poly_s = np.polynomial.polynomial.polyval(s, rho_s)
    arg = np.outer(u, s)
    return np.trapezoid(np.exp(-s) * (poly_c * np.cos(arg) + poly_s * np.sin(arg)), s, axis=-1)


def test_the_numerators_for_a_double_pair_are_the_papers_four():
    # App. C.3: for n = 2 the numerators over (1 + u^2)^2 are 1 + u^2, 1 - u^2 (cos, s^0 and s^1),
    # u + u^3 and 2 u (sin)
    rows = paper_checks.laplace_numerators(2)
    expected = torch.tensor([[1.0, 0, 1, 0], [1, 0, -1, 0], [0, 1, 0, 1], [0, 2, 0, 0]], dtype=torch.float64)
    torch.testing.assert_close(rows, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("numerator", "multiplicity"),
    [*((term[1], term[2]) for term in paper_checks.REPEATED_TERMS), ((0.3, -1.2, 0.7, 2.0, -0.4), 3)],
)
def test_repeated_pair_weights_integrate_to_the_rational_term(numerator, multiplicity):
    rho_c, rho_s = paper_checks.repeated_pair_weights(numerator, multiplicity)
    u = np.array([-3.0, -0.7, 0.0, 0.4, 1.0, 2.5])
    exact = np.polynomial.polynomial.polyval(u, numerator) / (1 + u**2) ** multiplicity
    integral = laplace_integral(rho_c.numpy(), rho_s.numpy(), u)
    np.testing.assert_allclose(integral, exact, rtol=0, atol=1e-8)


def test_repeated_pair_quadrature_is_the_weighted_node_sum_and_converges():
    rho_c, rho_s = paper_checks.repeated_pair_weights((1.0, 0.0, -1.0), 2)
    u = torch.linspace(-1.0, 1.0, 11, dtype=torch.float64)
    nodes, gammas = gauss_laguerre(5)
    plain = sum(
        float(g) * ((float(rho_c[0]) + float(rho_c[1]) * float(s)) * torch.cos(float(s) * u))
        + float(g) * ((float(rho_s[0]) + float(rho_s[1]) * float(s)) * torch.sin(float(s) * u))
        for s, g in zip(nodes, gammas, strict=True)
    )
    torch.testing.assert_close(paper_checks.repeated_pair_quadrature(rho_c, rho_s, u, 5), plain)
    exact = (1 - u**2) / (1 + u**2) ** 2
    errors = [
        float((paper_checks.repeated_pair_quadrature(rho_c, rho_s, u, n) - exact).abs().max())
        for n in (4, 16, 64)
    ]
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 1e-6


def test_a_numerator_of_too_high_degree_is_refused():
    with pytest.raises(ValueError, match=r"numerator: expected degree <= 3"):
        paper_checks.repeated_pair_weights((0, 0, 0, 0, 1.0), 2)


def test_node_set_error_is_the_least_squares_residual():
    t = torch.linspace(-4, 4, 301, dtype=torch.float64)
    f = F.gelu(t)
    atoms = torch.tensor([[0.3, -0.2, 0.5, 1.7]], dtype=torch.float64)
    nodes = torch.tensor([0.4, 1.9, 5.0], dtype=torch.float64)
    rms, coef_max = paper_checks.node_set_error(f, t, 2, atoms, nodes)
    tn = t.numpy()
    arg = np.outer((tn - 0.5) / 1.7, nodes.numpy())
    basis = np.column_stack([np.ones_like(tn), tn, tn**2, np.cos(arg), np.sin(arg)])
    coef, *_ = np.linalg.lstsq(basis, f.numpy(), rcond=None)
    assert rms == pytest.approx(float(np.sqrt(np.mean((basis @ coef - f.numpy()) ** 2))), rel=1e-6)
    assert coef_max == pytest.approx(float(np.abs(coef[3:]).max()), rel=1e-6)


def test_node_placement_rows_take_the_gauss_laguerre_nodes_and_exponential_draws():
    rows = paper_checks.node_placement_errors("sigmoid", (1, 3), draws=8, points=201)
    assert [r["num_freqs"] for r in rows] == [1, 3]
    for r in rows:
        assert r["mc_q25"] <= r["mc_median"] <= r["mc_q75"]
    # three Gauss-Laguerre nodes fit sigmoid's atom far better than one
    assert rows[1]["gl_rms"] < rows[0]["gl_rms"] / 10


def test_theorem1_terms_bound_the_exact_expected_error():
    torch.manual_seed(0)
    linear = torch.nn.Linear(3, 6)
    gen = torch.Generator().manual_seed(0)
    sample = 0.2 * torch.randn(64, 3, generator=gen, dtype=torch.float64)
    terms = paper_checks.theorem1_terms(linear, "gelu", sample, draws=4)
    assert terms.bound == pytest.approx(terms.eps_rat + terms.eps_quad + terms.std)
    assert terms.exact <= terms.bound * (1 + 1e-12)
    # eps_rat from the continuous fit's formula, written out
    layer = ralimp.create(
        "ralimp", linear.double(), "gelu", budget=32, sample=sample, fit="paper", weight_matrix="base", seed=0
    )
    fit = layer.fit.continuous
    t = linear.double()(sample).detach()
    rational = sum(c * t**n for n, c in enumerate(fit.poly))
    for a, b, p, q in fit.atoms:
        rational = rational + (a + b * (t - p)) / ((t - p) ** 2 + q**2)
    assert terms.eps_rat == pytest.approx(float((F.gelu(t) - rational).pow(2).mean().sqrt()), rel=1e-9)
    assert terms.signal == pytest.approx(float(F.gelu(t).pow(2).mean().sqrt()), rel=1e-12)


def test_chain_parameters_counts_the_built_layers():
    chain = paper_checks.stack_chain(2, 1, 4, 8, (1, 3))
    counts = paper_checks.chain_parameters(chain, "tanh", budget=8, num_atoms=0)
    dense = (2 * 8 + 8) + 3 * (8 * 8 + 8) + (8 + 1)
    assert counts["dense"] == dense
    # J = 0: F = 1 + K m = 1 + 2 * 8 = 17 columns of Psi(W) per replaced layer (8 rows)
    width = 17
    deployed = dense - 2 * (8 * 8 + 8) + 2 * 8 * width
    assert counts["ralimp_deployed"] == deployed
    # App. B: W' Psi(W) (reader rows x F) replaces Psi(W) and the reader's 8 x 8 weights
    assert counts["ralimp_compressed"] == deployed - 2 * 8 * width + (8 * width - 8 * 8) + (1 * width - 1 * 8)
    assert counts["projections"] == 2 * 2 * 8 * (8 + 1)  # K = 2 matrices of 8 x (d + 1) per replaced layer


def test_the_siren_stack_has_the_dense_siren_size():
    # 2 -> 64, three 64 -> 64 sine layers, 64 -> 1: 12,737 parameters
    counts = paper_checks.chain_parameters(
        paper_checks.stack_chain(2, 1, 4, 64, (1, 3)), torch.sin, budget=32, num_atoms=0
    )
    assert counts["dense"] == 2 * 64 + 64 + 3 * (64 * 64 + 64) + 65 == 12_737


def guarded_layer():
    """A 64 -> 64 relu layer at tau = 1 whose guard bound is far above float32's limit for ``x``."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 64)
    x = 8 * F.normalize(torch.randn(3, 64), dim=-1)
    layer = RaLiMP.from_linear(linear, "relu", seed=0, fit="discretized", interval=(-4.0, 4.0), tau=1.0)
    return layer, x


def test_unguarded_runs_the_layer_and_records_both_exponents():
    layer, x = guarded_layer()
    with pytest.raises(ValueError, match="log second moment"):
        layer(x)
    with torch.no_grad(), guard_off.unguarded() as log:
        y = layer(x)
    assert torch.isfinite(y).all()
    # plain references: the guard's bound and the largest sqrt(s/2) omega . u over inputs and weight rows
    u = torch.cat([x, torch.ones(3, 1)], -1).double()
    wb = torch.cat([layer.weight, layer.bias[:, None]], -1).detach().double()
    lam, tau = float(layer.scale), float(layer.tau)
    freq = float(layer.nodes.max()) / float(layer.pole_widths().detach().min())
    bound = freq * (float(u.norm(dim=-1).max()) / (lam * tau) + lam * float(wb.norm(dim=-1).max()) / tau) ** 2
    assert log.bounds == [pytest.approx(bound, rel=1e-5)]
    with torch.no_grad():
        _, omega, _, freqs = layer._projections(torch.float64)
    z = [(side @ omega.T) * (freqs / 2).sqrt() for side in (u / (lam * tau), wb * lam / tau)]
    assert log.largest_exponent == pytest.approx(float(max(v.max() for v in z)), rel=1e-5)
    assert log.largest_exponent < 80.7 < log.largest_bound
    assert log.nonfinite_calls == 0
    assert log.feature_calls == 2
    with pytest.raises(ValueError, match="log second moment"):  # the guard is back after the block
        layer(x)


def test_main_runs_a_module_unguarded_and_prints_the_log(tmp_path, monkeypatch, capsys):
    (tmp_path / "guarded_script.py").write_text(
        "import sys, torch\n"
        "from test_paper_checks import guarded_layer\n"
        "layer, x = guarded_layer()\n"
        "with torch.no_grad():\n"
        "    print('finite', bool(torch.isfinite(layer(x)).all()), sys.argv[1:])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    code = guard_off.main(["guarded_script", "--flag", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "finite True ['--flag', '1']" in out
    assert "guard bound 2 sigma^2 (log second moment, worst aligned pair)" in out
    assert sys.argv[0] != "guarded_script"  # restored


def test_the_command_prints_the_repeated_pairs_table(capsys):
    paper_checks.main(["repeated-pairs", "--nodes", "3", "64"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("| term")
    assert len(lines) == 2 + len(paper_checks.REPEATED_TERMS)
    assert "| 1/(1+u^2)^2 " in lines[4]
