"""Gauss-Laguerre rules, rational fits and the shipped fits."""

import math

import pytest
import torch

import ralimp
from ralimp import RationalFunction, fit_rational, gauss_laguerre


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_gauss_laguerre_integrates_s_to_the_j_exactly_up_to_2n_minus_1(n):
    nodes, weights = gauss_laguerre(n)
    for j in range(2 * n):
        exact = math.factorial(j)
        assert abs(float((weights * nodes**j).sum()) - exact) <= 1e-9 * exact, j
    # and not beyond: degree 2n is not integrated exactly
    assert abs(float((weights * nodes ** (2 * n)).sum()) - math.factorial(2 * n)) > 1e-6


def test_gauss_laguerre_weights_are_positive_and_sum_to_one():
    nodes, weights = gauss_laguerre(6)
    assert (weights > 0).all()
    assert (nodes > 0).all()
    assert abs(float(weights.sum()) - 1) < 1e-14


def test_gauss_laguerre_rejects_a_non_positive_count():
    with pytest.raises(ValueError, match="n: expected an integer >= 1, got 0"):
        gauss_laguerre(0)


def test_partial_fraction_form_evaluates_equal_to_the_fitted_function():
    fit = fit_rational(torch.tanh, (-3.0, 3.0), num_atoms=2, poly_degree=1, num_starts=3)
    t = torch.linspace(-3, 3, 301, dtype=torch.float64)
    expected = sum(c * t**n for n, c in enumerate(fit.poly))
    for a, b, p, q in fit.atoms:
        expected = expected + (a + b * (t - p)) / ((t - p) ** 2 + q**2)
    torch.testing.assert_close(fit(t), expected, rtol=1e-13, atol=1e-13)
    # the recorded errors are those of the fitted function against tanh
    assert fit.max_error == pytest.approx(float((fit(t) - torch.tanh(t)).abs().max()), rel=0.05)
    roundtrip = RationalFunction.from_dict(fit.to_dict())
    torch.testing.assert_close(roundtrip(t), fit(t))


def test_fit_recovers_an_exact_rational_function():
    truth = RationalFunction([0.5, -0.25], [(1.5, 0.7, 0.8, 1.3)], (-4.0, 4.0))
    fit = fit_rational(truth, (-4.0, 4.0), num_atoms=1, poly_degree=1, num_starts=4)
    assert fit.max_error < 1e-9
    a, b, p, q = fit.atoms[0]
    assert (a, b, p, q) == pytest.approx((1.5, 0.7, 0.8, 1.3), abs=1e-6)


def test_fitted_widths_respect_the_floor():
    fit = fit_rational("softsign", num_atoms=2, poly_degree=1, q_floor=0.9, num_starts=2)
    assert all(q >= 0.9 for *_, q in fit.atoms)


@pytest.mark.parametrize("name", ["gelu", "silu", "tanh", "sigmoid"])
def test_shipped_fits_reach_1e_4_with_three_atoms_on_minus_4_4(name):
    fit = ralimp.activation_fit(name, poly_degree=2, num_atoms=3)
    assert fit.interval == (-4.0, 4.0)
    max_error, _ = fit.errors(ralimp.ACTIVATIONS.get(name))
    assert max_error < 1e-4
    assert all(q > 0 for *_, q in fit.atoms)


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "silu", "tanh", "sigmoid", "softsign", "relu"])
def test_shipped_fits_exist_for_every_activation_and_more_atoms_do_not_hurt(name):
    errors = [ralimp.activation_fit(name, poly_degree=2, num_atoms=j).max_error for j in range(4)]
    assert errors[3] <= errors[1] * 1.01
    assert errors[1] <= errors[0] * 1.01


def test_fit_errors_name_the_argument():
    with pytest.raises(ValueError, match="interval: expected"):
        fit_rational(torch.tanh, (1.0, -1.0), num_atoms=1, poly_degree=1)
    with pytest.raises(ValueError, match="num_atoms: expected an integer >= 0, got -1"):
        fit_rational(torch.tanh, num_atoms=-1, poly_degree=1)
    with pytest.raises(ValueError, match="unknown activation 'swishy'"):
        fit_rational("swishy", num_atoms=1, poly_degree=1)
    with pytest.raises(ValueError, match="atoms: expected every width q > 0"):
        RationalFunction([0.0], [(1.0, 0.0, 0.0, 0.0)])


def test_discretized_fit_recovers_a_function_of_the_layers_basis():
    # P(t) + w_c cos(s_k t / q) + w_s sin(s_k t / q) at the 3 nodes with q = 1.7: exactly representable
    nodes, _ = gauss_laguerre(3)
    truth = ralimp.DiscretizedFit([0.2, 0.5, -0.1], [(0.0, 0.0, 0.0, 1.7)], [[0.0, 0.0, 0.0]], [[0.0] * 3])
    t = torch.linspace(-4, 4, 2001, dtype=torch.float64)

    def target(t):
        arg = t.unsqueeze(-1) * nodes / 1.7
        return truth(t) + (torch.tensor([0.3, -0.2, 0.05]) * arg.cos() + 0.1 * arg.sin()).sum(-1)

    fit = ralimp.fit_discretized(target, poly_degree=2, num_atoms=1, num_freqs=3, coef_penalty=0.0)
    assert fit.max_error < 1e-8
    assert fit.atoms[0][3] == pytest.approx(1.7, rel=1e-6)
    torch.testing.assert_close(fit(t), target(t), rtol=0, atol=1e-8)


def test_discretized_fit_node_weights_sum_to_one_and_round_trip():
    fit = ralimp.layer_fit("tanh", poly_degree=2, num_atoms=2, num_freqs=3)
    assert fit.num_freqs == 3
    sums = torch.cat([fit.node_cos.sum(-1), fit.node_sin.sum(-1)])
    nonzero = sums.abs() > 0
    torch.testing.assert_close(sums[nonzero], torch.ones_like(sums[nonzero]))
    t = torch.linspace(-4, 4, 101, dtype=torch.float64)
    torch.testing.assert_close(ralimp.DiscretizedFit.from_dict(fit.to_dict())(t), fit(t))
    # the layer's expectation is this fit, and the discretized error beats the node-wise quadrature
    old = ralimp.discretized.nodewise_quadrature(fit.continuous, 3)
    assert fit.max_error < 0.1 * old.errors(torch.tanh)[0]


def test_gelu_tanh_is_gpt2s_gelu_and_is_recognized():
    t = torch.linspace(-4, 4, 101, dtype=torch.float64)
    expected = 0.5 * t * (1 + torch.tanh(math.sqrt(2 / math.pi) * (t + 0.044715 * t**3)))
    torch.testing.assert_close(ralimp.ACTIVATIONS.get("gelu_tanh")(t), expected)
    assert ralimp.activation_name(torch.nn.GELU(approximate="tanh")) == "gelu_tanh"
    assert ralimp.activation_name(torch.nn.GELU()) == "gelu"

    class NewGELUActivation(torch.nn.Module):  # Hugging Face's name for GPT-2's GELU
        pass

    class QuickGELUActivation(torch.nn.Module):
        pass

    assert ralimp.activation_name(NewGELUActivation()) == "gelu_tanh"
    assert ralimp.activation_name(QuickGELUActivation()) is None
    fit = ralimp.layer_fit("gelu_tanh", poly_degree=2, num_atoms=3, num_freqs=3)
    assert fit.errors(ralimp.ACTIVATIONS.get("gelu_tanh"))[0] < 1e-4
