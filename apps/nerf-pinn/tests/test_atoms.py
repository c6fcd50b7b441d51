import torch

from nerf_pinn.atoms import atom_tradeoff
from nerf_pinn.layers import FeedForward


def tradeoff():
    torch.manual_seed(0)
    layer = FeedForward(4, 8, "tanh")
    return {(r["atoms"], r["fit"]): r for r in atom_tradeoff(layer, torch.randn(128, 4), budget=32)}


def test_the_variance_aware_fit_has_the_least_expected_error_among_fits_of_its_basis():
    rows = tradeoff()
    assert rows[0, "variance"]["total"] <= rows[0, "discretized"]["total"] * (1 + 1e-9)


def test_an_atom_lowers_the_bias_of_the_least_squares_fit():
    rows = tradeoff()
    assert rows[1, "discretized"]["bias2"] < rows[0, "discretized"]["bias2"]


def test_the_variance_of_every_fit_is_nonnegative():
    assert all(row["variance"] >= -1e-12 for row in tradeoff().values())


def test_the_spread_of_an_exact_replacement_is_zero():
    from nerf_pinn.atoms import relative_spread

    torch.manual_seed(0)
    layer = FeedForward(4, 8, "tanh")
    assert relative_spread(layer, torch.randn(64, 4), "dense", budget=None, seeds=2) < 1e-6
