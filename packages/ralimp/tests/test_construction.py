"""RaLiMP's plain constructor, the fit of `from_linear` and `load_linear`, and the public routes' layers."""

import pytest
import torch
from torch import nn

import ralimp
from ralimp import RaLiMP
from ralimp.fits import FitOptions, Sizes


def test_the_constructor_builds_and_does_not_fit():
    layer = RaLiMP(16, 8, seed=0)
    assert (layer.num_atoms, layer.num_freqs, layer.num_random_features) == (1, 3, 32)
    assert layer.fit_record()["calibration"] == "not fitted"
    assert layer.fit_record()["fit_range"] is None
    with pytest.raises(RuntimeError, match=r"fit: layer RaLiMP\(16 -> 8\) was built and not fitted"):
        _ = layer.fit
    with torch.no_grad():  # every coefficient is 0 (small inputs: the exponent guard knows no fit)
        assert torch.equal(layer(0.1 * torch.randn(3, 16)), torch.zeros(3, 8))


def test_the_constructor_takes_the_sizes_flat_as_the_design_names_them():
    flat = RaLiMP(16, 8, poly_degree=3, poly_features=4, num_atoms=2, num_freqs=2, freq_features=3, tau=0.5)
    grouped = RaLiMP(16, 8, sizes=Sizes(3, 2, 2, 4, 3), options=FitOptions(tau=0.5))
    assert (flat.poly_degree, flat.num_atoms, flat.num_freqs) == (3, 2, 2)
    # App. D.1's budget: m + 2 J n_freq m_freq (the polynomial block's m counted once)
    assert flat.num_random_features == grouped.num_random_features == 4 + 2 * 2 * 2 * 3
    assert flat.options == grouped.options
    # a flat size wins over the grouped one
    assert RaLiMP(16, 8, sizes=Sizes(num_atoms=2), num_atoms=0).num_atoms == 0


def test_load_linear_fits_a_built_layer_as_from_linear_does(small_layer_data):
    linear, x = small_layer_data
    options = FitOptions(fit="discretized")  # the fit keeps J = 1, the constructor's default
    made = RaLiMP.from_linear(linear, "gelu", sample=x, seed=3, options=options)
    built = RaLiMP(4, 6, seed=3, options=options, dtype=torch.float64)
    built.load_linear(linear.weight.detach(), linear.bias.detach(), sample=x)
    for (name, a), b in zip(made.state_dict().items(), built.state_dict().values(), strict=True):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), name
    assert built.fit_record() == made.fit_record()
    # a state dict restores a fitted layer into a built one
    restored = RaLiMP(4, 6, dtype=torch.float64)
    restored.load_state_dict(made.state_dict())
    with torch.no_grad():
        assert torch.equal(restored(x), made(x))


def test_from_linear_takes_the_sizes_and_options_grouped_or_flat(small_layer_data):
    linear, _ = small_layer_data
    layer = RaLiMP.from_linear(
        linear,
        "tanh",
        sizes=Sizes(num_freqs=2, freq_features=6),
        options=FitOptions(fit="discretized", interval=(-3, 3)),
        num_atoms=2,  # flat keywords override the grouped ones
        q_floor=0.1,
        seed=0,
    )
    assert layer.sizes() == Sizes(2, 2, 2, 8, 6)
    assert layer.options == FitOptions(fit="discretized", interval=(-3.0, 3.0), q_floor=0.1)
    assert layer.fit.interval == (-3.0, 3.0)


def _state_sums(module: nn.Module) -> tuple[float, float]:
    """``(sum, sum of |.|)`` of every floating tensor of the state dict, in float64."""
    values = [
        v.double() for v in module.state_dict().values() if torch.is_tensor(v) and v.is_floating_point()
    ]
    return sum(float(v.sum()) for v in values), sum(float(v.abs().sum()) for v in values)


def _data(d: int, out: int, seed: int, scale: float) -> tuple[nn.Linear, torch.Tensor]:
    torch.manual_seed(seed)
    linear = nn.Linear(d, out, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    return linear, torch.randn(64, d, generator=gen, dtype=torch.float64) * scale


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act = nn.Linear(8, 32, dtype=torch.float64), nn.GELU()
        self.fc2 = nn.Linear(32, 8, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def _create_variance() -> tuple[nn.Module, torch.Tensor]:
    linear, x = _data(12, 20, 0, 3.0)
    return ralimp.create("ralimp", linear, "gelu", budget=32, sample=x, seed=0), x


def _create_variance_atom() -> tuple[nn.Module, torch.Tensor]:
    linear, x = _data(4, 16, 4, 1.0)
    with torch.no_grad():
        linear.weight.mul_(6.0)
    return ralimp.create("ralimp", linear, torch.sin, budget=1024, sample=x, seed=4), x


def _from_linear_discretized() -> tuple[nn.Module, torch.Tensor]:
    linear, x = _data(6, 5, 1, 0.5)
    return RaLiMP.from_linear(linear, "tanh", sample=x, fit="discretized", num_freqs=2, seed=1), x


def _create_paper_lstsq() -> tuple[nn.Module, torch.Tensor]:
    linear, x = _data(6, 5, 2, 1.0)
    layer = ralimp.create(
        "ralimp", linear, "silu", budget=32, fit="paper", tau=1.0, seed=2, init="lstsq", sample=x
    )
    return layer, x


def _replace_mlp() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(3)
    model = nn.Sequential(_MLP(), _MLP())
    x = torch.randn(32, 8, dtype=torch.float64)
    ralimp.replace_mlp(model, "ralimp", budget=32, inputs=x, seed=3)
    return model, x


# Measured on the code before the constructor stopped fitting and before the variance fit was batched
# (the commit before this file): (J, sum and sum of |.| of the state dict, sum and sum of |.| of the output
# on the calibration inputs), float64 throughout, and the tolerance relative to the sizes. The routes must
# give the same layers, to float64 rounding times the conditioning of their solves: 1e-9, except the
# discretized fit, whose ridge of 1e-8 (`fit_discretized`'s coef_penalty) on near-collinear columns allows a
# condition number up to ~1e8, so another CPU's summation order moves it by up to ~1e8 x 1.1e-16 ~ 1e-8
# (1.6e-9 measured between an AMD EPYC and an Intel Xeon): 1e-7 there.
PINNED = {
    "create variance": (
        _create_variance,
        0,
        (59.77169201998164, 733.252344066125, 703.35003693259, 952.8842744972671),
        1e-9,
    ),
    "create variance, an atom kept": (
        _create_variance_atom,
        1,
        (21.079476400543708, 3696.6104584345258, 5.262241294258084, 12.008462167999078),
        1e-9,
    ),
    "from_linear discretized": (
        _from_linear_discretized,
        1,
        (-16.26563167899256, 162.2681787912915, 2643.446071878708, 3113.7332696679027),
        1e-7,
    ),
    "create paper lstsq": (
        _create_paper_lstsq,
        1,
        (4.426606845539645, 206.23431834221293, 16.874902747784844, 74.22704467510258),
        1e-9,
    ),
    "replace_mlp": (
        _replace_mlp,
        None,
        (-24.85522209374272, 1072.0733838240867, 23.704199428008017, 33.02169719583245),
        1e-9,
    ),
}


@pytest.mark.parametrize("route", list(PINNED))
def test_the_public_routes_give_the_layers_they_gave_before(route):
    make, atoms, (state_sum, state_size, out_sum, out_size), rel = PINNED[route]
    module, x = make()
    assert getattr(module, "num_atoms", None) == atoms
    with torch.no_grad():
        y = module(x)
    got_sum, got_size = _state_sums(module)
    assert got_size == pytest.approx(state_size, rel=rel)
    assert abs(got_sum - state_sum) <= rel * state_size
    assert float(y.abs().sum()) == pytest.approx(out_size, rel=rel)
    assert abs(float(y.sum()) - out_sum) <= rel * out_size
