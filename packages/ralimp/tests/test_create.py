"""ralimp.create: every kind spends its budget exactly, refuses what it cannot, and the calibrated start."""

import pytest
import torch
import torch.nn.functional as F

import ralimp
from ralimp import BudgetError
from spectraformer_core.testing import relative_error


@pytest.fixture
def linear():
    torch.manual_seed(0)
    return torch.nn.Linear(12, 20, dtype=torch.float64)


@pytest.mark.parametrize("kind", ["ralimp", "eugen", "snnk", "lowrank"])
@pytest.mark.parametrize("budget", [8, 32, 100, 128])
def test_create_spends_the_budget_exactly_as_the_paper_counts(kind, budget, linear):
    layer = ralimp.create(kind, linear, "gelu", budget=budget, seed=0)
    assert isinstance(layer, ralimp.LAYERS.get(kind))
    assert layer.num_random_features == budget


@pytest.mark.parametrize(("kind", "budget"), [("ralimp", 33), ("ralimp", 129), ("eugen", 33), ("snnk", 64)])
def test_width_matched_budgets_set_the_width_of_phi(kind, budget, linear):
    layer = ralimp.create(kind, linear, "gelu", budget=budget, count="width", seed=0)
    assert layer.feature_dim == budget
    assert layer.feature_map(torch.zeros(2, 12, dtype=torch.float64)).shape[-1] == budget


def test_ralimp_budget_of_32_is_app_d1s_split(linear):
    layer = ralimp.create("ralimp", linear, "gelu", budget=32, seed=0, fit="discretized")
    assert layer.poly_matrices[0].num_features == 8
    assert [m.num_features for m in layer.freq_matrices] == [4, 4, 4]
    # the GPT-2 section's 2 nodes x 4 projections: the polynomial block takes the rest
    gpt = ralimp.create(
        "ralimp", linear, "gelu", budget=128, num_freqs=2, freq_features=4, seed=0, fit="discretized"
    )
    assert gpt.poly_matrices[0].num_features == 128 - 2 * 2 * 4


@pytest.mark.parametrize("count", ["paper", "width"])
def test_a_variance_aware_choice_of_fewer_atoms_keeps_the_budget(count, linear):
    # fit="variance" (the default) may choose fewer atoms; the features they free go to the polynomial
    # block, so the budget (as counted) is spent exactly either way
    x = torch.randn(256, 12, dtype=torch.float64) * 3.0
    layer = ralimp.create("ralimp", linear, "gelu", budget=33, count=count, sample=x, seed=0, num_atoms=1)
    spent = layer.num_random_features if count == "paper" else layer.feature_dim
    assert spent == 33
    record = ralimp.fit_summary(layer)[""]
    assert record["num_atoms"] == layer.num_atoms <= 1
    assert record["feature_width"] == layer.feature_dim


def test_budgets_a_kind_cannot_spend_are_refused_with_the_nearest_valid_ones(linear):
    with pytest.raises(BudgetError, match=r"nearest valid budgets: \[8\]"):
        ralimp.create("ralimp", linear, "gelu", budget=5)
    with pytest.raises(BudgetError, match=r"nearest valid budgets: \[31, 33\]"):
        ralimp.create("eugen", linear, "gelu", budget=32, count="width")
    with pytest.raises(BudgetError, match=r"nearest valid budgets: \[25\]"):
        ralimp.create("ralimp", linear, "gelu", budget=20, freq_features=4)
    with pytest.raises(BudgetError, match="num_features: set by the budget"):
        ralimp.create("eugen", linear, "gelu", budget=32, num_features=16)
    with pytest.raises(BudgetError, match="poly_features and freq_features are both set"):
        ralimp.create("ralimp", linear, "gelu", budget=32, poly_features=8, freq_features=4)
    with pytest.raises(ValueError, match="count: expected one of"):
        ralimp.create("ralimp", linear, "gelu", budget=32, count="rows")


def test_dense_is_the_layer_itself_and_takes_no_budget(linear):
    x = torch.randn(5, 12, dtype=torch.float64)
    dense = ralimp.create("dense", linear, "gelu", budget=None, seed=0)
    assert dense.num_random_features is None
    with torch.no_grad():
        torch.testing.assert_close(dense(x), F.gelu(linear(x)))
    with pytest.raises(BudgetError, match="expected None, got 32"):
        ralimp.create("dense", linear, "gelu", budget=32)


@pytest.mark.parametrize("kind", ["ralimp", "eugen", "snnk"])
def test_lstsq_readout_solves_the_normal_equations(kind, linear):
    x = torch.randn(400, 12, dtype=torch.float64) * 0.5
    layer = ralimp.create(kind, linear, "gelu", budget=32, sample=x, init="lstsq", ridge=0.0, seed=0)
    with torch.no_grad():
        phi = layer.feature_map(x)
        residual = layer(x) - F.gelu(linear(x))
    # least squares: the residual is orthogonal to every feature column (relative to the column scale;
    # SNNK's zero frequency has an all-zero Im column)
    scale = (phi.norm(dim=0, keepdim=True).mT * residual.norm(dim=0, keepdim=True)).clamp_min(1e-300)
    assert float((phi.mT @ residual / scale).abs().max()) < 1e-6


@pytest.mark.parametrize("kind", ["ralimp", "eugen", "snnk", "lowrank"])
@pytest.mark.parametrize("init", ["psi", "lstsq"])
def test_every_trainable_parameter_gets_a_gradient(kind, init, linear):
    # DDP stops on a parameter that requires a gradient and never gets one (a readout absorbs W, b, ...)
    x = torch.randn(64, 12, dtype=torch.float64)
    layer = ralimp.create(kind, linear, "gelu", budget=32, sample=x, init=init, seed=0)
    layer(x).pow(2).sum().backward()
    missing = [name for name, p in layer.named_parameters() if p.requires_grad and p.grad is None]
    assert missing == []
    assert any(p.requires_grad for p in layer.parameters())


def test_load_linear_after_a_fitted_readout_trains_w_again(linear):
    x = torch.randn(64, 12, dtype=torch.float64)
    layer = ralimp.create(
        "ralimp", linear, "gelu", budget=32, sample=x, init="lstsq", seed=0, fit="discretized"
    )
    assert not layer.weight.requires_grad
    layer.load_linear(linear.weight.detach(), linear.bias.detach(), sample=x)
    assert layer.readout is None
    assert layer.weight.requires_grad
    assert layer.node_cos.requires_grad
    layer(x).sum().backward()
    assert layer.weight.grad is not None


@pytest.mark.parametrize("kind", ["ralimp", "eugen", "snnk"])
def test_lstsq_start_beats_psi_on_held_out_inputs(kind, linear):
    gen = torch.Generator().manual_seed(1)
    calibration, held_out = (torch.randn(n, 12, generator=gen, dtype=torch.float64) for n in (2000, 500))
    target = F.gelu(linear(held_out)).detach()
    errors = {}
    # SNNK's features of x alone (||x||^2 ~ 12) are log-normal, exp(sqrt(xi / 2) g . x): its readout fitted at
    # balance 1 does not generalize (0.7 to 2.9 held out over seeds); balance="auto" is its calibrated start
    options = {"balance": "auto"} if kind == "snnk" else {}
    for init in ("psi", "lstsq"):
        layer = ralimp.create(
            kind, linear, "gelu", budget=32, sample=calibration, init=init, seed=0, **options
        )
        with torch.no_grad():
            errors[init] = relative_error(layer(held_out), target) ** 2
    # 32 random features cannot span gelu of 20 units (the floor is well above 0), but the fitted readout
    # is far below the unbiased start, whose log-normal variance dominates
    assert errors["lstsq"] < 0.8
    assert errors["lstsq"] < errors["psi"] / 1.5


def test_lowrank_lstsq_minimizes_the_preactivation_error_on_the_sample(linear):
    gen = torch.Generator().manual_seed(2)
    # anisotropic inputs: the data-aware truncation differs from the plain SVD
    x = torch.randn(3000, 12, generator=gen, dtype=torch.float64) * torch.logspace(
        0, -2, 12, dtype=torch.float64
    )
    errors = {}
    for init in ("psi", "lstsq"):
        layer = ralimp.create("lowrank", linear, "gelu", budget=4, sample=x, init=init)
        with torch.no_grad():
            errors[init] = float((layer.up(layer.down(x)) - linear(x)).pow(2).mean())
    assert errors["lstsq"] < 0.5 * errors["psi"]
    full = ralimp.create("lowrank", linear, "gelu", budget=12, sample=x, init="lstsq")
    with torch.no_grad():
        torch.testing.assert_close(full(x), F.gelu(linear(x)))


def test_init_errors_name_the_argument(linear):
    with pytest.raises(ValueError, match="sample: init='lstsq' fits the readout"):
        ralimp.create("eugen", linear, "gelu", budget=32, init="lstsq")
    with pytest.raises(ValueError, match="init: expected one of"):
        ralimp.create("eugen", linear, "gelu", budget=32, init="svd")
