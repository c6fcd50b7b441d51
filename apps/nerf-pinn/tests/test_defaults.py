"""What ``--fit-range`` and ``--fit`` do; NeRF's fit defaults; the quick run's threads."""

import pytest
import torch
from torch import nn

from nerf_pinn.config import NerfConfig, PinnConfig
from nerf_pinn.layers import FeedForward, linearize_mlp_layers


@pytest.mark.parametrize("kind", ["ralimp", "eugen"])
def test_fit_range_sets_the_fit_interval_and_zero_keeps_the_samples(kind):
    torch.manual_seed(0)
    x = 0.1 * torch.randn(64, 8)
    for fit_range in (4.0, 0.0):
        stack = nn.ModuleList([FeedForward(8, 8, "relu")])
        linearize_mlp_layers(
            stack, kind, budget=32, indices=[0], inputs=[x], num_atoms=0, fit_range=fit_range
        )
        lo, hi = stack[0].fit.interval
        t = stack[0].fit_record()["fit_range"]
        assert [lo, hi] == pytest.approx(t)
        if fit_range:
            assert (lo, hi) == (-4.0, 4.0)
        else:  # the calibration sample's range, far inside [-4, 4] at these inputs
            assert 0 < hi - lo < 2.0


def test_nerf_fits_on_a_fixed_range_by_default_and_the_others_on_the_sample():
    assert (NerfConfig().fit_range, NerfConfig().num_atoms) == (4.0, 0)
    assert PinnConfig().fit_range == 0.0
    with pytest.raises(ValueError, match="--fit-range"):
        NerfConfig(fit_range=-1.0)


def test_fit_chooses_ralimps_fit_mode_and_nerf_fits_by_least_squares_on_orthogonal_projections():
    torch.manual_seed(0)
    x = 0.1 * torch.randn(64, 8)
    for fit in ("variance", "discretized", "paper"):
        stack = nn.ModuleList([FeedForward(8, 8, "relu")])
        linearize_mlp_layers(
            stack, "ralimp", budget=32, indices=[0], inputs=[x], num_atoms=0, fit_range=4.0, fit=fit
        )
        assert stack[0].fit_record()["fit"] == fit
    assert (NerfConfig().fit, PinnConfig().fit) == ("discretized", "variance")
    assert (NerfConfig().weight_matrix, PinnConfig().weight_matrix) == ("orf", "base")
    with pytest.raises(ValueError, match="--fit"):
        NerfConfig(fit="lstsq")


def test_quick_runs_on_one_thread_by_default():
    from nerf_pinn.cli import QuickConfig

    assert QuickConfig().threads == 1
    assert QuickConfig(threads=0).threads == 0


def test_the_balance_is_a_departure_only_where_a_layer_has_complex_exponential_features():
    torch.manual_seed(0)
    x = 0.1 * torch.randn(64, 8)
    config = PinnConfig()  # balance "auto"
    departures = {}
    for atoms in (0, 1):
        stack = nn.ModuleList([FeedForward(8, 8, "tanh")])
        linearize_mlp_layers(
            stack, "ralimp", budget=32, indices=[0], inputs=[x], num_atoms=atoms, fit="discretized"
        )
        assert stack[0].num_atoms == atoms
        departures[atoms] = config.departures("ralimp", stack)
    assert departures[0] == []
    assert "balance='auto'" in departures[1][0]
    assert PinnConfig(balance="1").departures("ralimp", stack) == []
