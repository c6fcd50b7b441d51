"""The variance-aware fit: the batched width search against a plain loop, and the choices it made before."""

import math

import pytest
import torch

from ralimp.activations import ACTIVATIONS
from ralimp.calibration import calibrate, layer_scales
from ralimp.discretized import node_basis
from ralimp.fits import FitOptions, Sizes, WidthSearch, basis_covariance, choose_atoms, variance_fit
from ralimp.quadrature import gauss_laguerre
from ralimp.ridge import scaled_ridge_solve


def _calibration(d, out, n, weight_scale, input_scale, seed, *, balance=1.0, tau="auto", sample=True):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out, d, generator=gen, dtype=torch.float64) * weight_scale / d**0.5
    b = torch.randn(out, generator=gen, dtype=torch.float64) * 0.1
    x = torch.randn(n, d, generator=gen, dtype=torch.float64) * input_scale if sample else None
    tau_value, lam = layer_scales(w, b, x, tau=tau, tau_c=1.0, balance=balance)
    return calibrate(w, b, x, tau=tau_value, balance=lam)


def _plain_cost(fn, cal, sizes, widths_t, points):
    """One candidate as a plain loop sees it: its basis, covariance, ridge solve and cost, unbatched."""
    nodes = gauss_laguerre(sizes.num_freqs)[0]
    basis = node_basis(points, widths_t, nodes, sizes.poly_degree)
    f = fn(points).to(torch.float64)
    cov = basis_covariance(cal, sizes, widths_t)
    if not torch.isfinite(cov).all():
        return math.inf
    coef = scaled_ridge_solve(basis, f, penalty=cov)
    return float((basis @ coef - f).pow(2).mean() + coef @ cov @ coef)


@pytest.mark.parametrize(
    ("activation", "sizes", "options"),
    [
        ("gelu", Sizes(2, 1, 3, 64, 16), FitOptions()),
        ("tanh", Sizes(1, 2, 2, 32, 32), FitOptions(interval=(-3.0, 3.0))),
    ],
)
def test_the_batched_search_costs_every_candidate_as_a_plain_loop_does(activation, sizes, options):
    fn = ACTIVATIONS.get(activation)
    cal = _calibration(6, 12, 40, 1.0, 1.0, seed=1)
    search = WidthSearch(fn, cal, options, poly_degree=sizes.poly_degree, num_freqs=sizes.num_freqs, grid=12)
    grid = search.widths.numel()
    # every candidate of the first atom with the second fixed at the middle of the grid (J = 2), or alone
    choices = torch.stack([torch.arange(grid), torch.full((grid,), grid // 2)], -1)[:, : sizes.num_atoms]
    _, costs = search.solve(sizes, choices)
    points = search.points
    plain = [_plain_cost(fn, cal, sizes, search.widths[c] * cal.tau**2, points) for c in choices]
    torch.testing.assert_close(costs, torch.tensor(plain, dtype=torch.float64), rtol=1e-9, atol=0)
    # and the fit keeps the best of them in float32 (ties to the narrowest), as the plain loop's argmin
    fit = variance_fit(fn, cal, Sizes(sizes.poly_degree, 1, sizes.num_freqs, 64, 16), options, grid=12)
    single = [
        _plain_cost(fn, cal, Sizes(sizes.poly_degree, 1, sizes.num_freqs, 64, 16), q * cal.tau**2, points)
        for q in search.widths.unsqueeze(-1)
    ]
    best = int(torch.tensor(single, dtype=torch.float32).argmin())
    assert fit.atoms[0][3] == pytest.approx(float(search.widths[best]) * cal.tau**2, rel=1e-12)


# Measured on the code before the width search was batched (one solve per candidate), widths in t units:
# (calibration, activation, sizes, options) -> (variance_fit's widths, choose_atoms's J, its widths).
BEFORE = {
    "sin, balance auto: an atom kept": (
        {"d": 4, "out": 32, "n": 128, "weight_scale": 2.0, "input_scale": 1.0, "seed": 4, "balance": "auto"},
        "sin",
        Sizes(2, 1, 3, 512, 512),
        FitOptions(balance="auto"),
        [29.27313337759779],
        1,
        [29.27313337759779],
    ),
    "gelu, small pre-activations": (
        {"d": 16, "out": 32, "n": 128, "weight_scale": 0.4, "input_scale": 0.1, "seed": 0},
        "gelu",
        Sizes(2, 1, 3, 256, 256),
        FitOptions(),
        [363.3381406532281],
        0,
        [],
    ),
    "softsign, two atoms, q_floor 0.2": (
        {"d": 6, "out": 10, "n": 100, "weight_scale": 0.2, "input_scale": 0.2, "seed": 6},
        "softsign",
        Sizes(2, 2, 3, 4096, 4096),
        FitOptions(q_floor=0.2),
        [1.7249673802515941, 2.2108384888202712],
        0,
        [],
    ),
    "tanh, three atoms on an interval": (
        {"d": 8, "out": 16, "n": 64, "weight_scale": 0.5, "input_scale": 0.5, "seed": 3},
        "tanh",
        Sizes(1, 3, 2, 32, 32),
        FitOptions(interval=(-3.0, 3.0)),
        [3.7556538391327785] * 3,
        0,
        [],
    ),
    "relu, standard-normal inputs, tau 1": (
        {
            "d": 8,
            "out": 16,
            "n": 256,
            "weight_scale": 0.3,
            "input_scale": 1.0,
            "seed": 5,
            "tau": 1.0,
            "sample": False,
        },
        "relu",
        Sizes(3, 1, 4, 1024, 1024),
        FitOptions(tau=1.0),
        [1252.8369428712188],
        0,
        [],
    ),
}


@pytest.mark.parametrize("case", list(BEFORE))
def test_the_widths_and_the_number_of_atoms_are_the_ones_chosen_before(case):
    cal_kw, activation, sizes, options, widths, atoms, chosen_widths = BEFORE[case]
    fn = torch.sin if activation == "sin" else ACTIVATIONS.get(activation)
    cal = _calibration(**cal_kw)
    fit = variance_fit(fn, cal, sizes, options)
    assert [a[3] for a in fit.atoms] == pytest.approx(widths, rel=1e-12)
    chosen, chosen_fit = choose_atoms(fn, cal, sizes, options)
    assert chosen.num_atoms == atoms
    assert [a[3] for a in chosen_fit.atoms] == pytest.approx(chosen_widths, rel=1e-12)
