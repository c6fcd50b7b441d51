"""Lemma 1 and Proposition 1: the complex-exponential estimators of cos(s t) and sin(s t)."""

import math

import pytest
import torch

from ralimp import complex_exponential_features, cos_sin_estimate, product_features


def _pair():
    x = torch.tensor([[0.3, -0.2, 0.4]], dtype=torch.float64)
    w = torch.tensor([[0.6, 0.1, 0.5]], dtype=torch.float64)
    return x, w


def test_cos_sin_estimators_are_unbiased_over_many_seeds():
    x, w = _pair()
    s = 1.7
    draws = 200_000
    omega = torch.randn(draws, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    # one projection per draw: the per-projection terms Y^c, Y^s of Prop. 1 (weights 1)
    ones = torch.ones(draws, dtype=torch.float64)
    cos, sin = cos_sin_estimate(x, w, omega, s, weights=ones / draws)
    t = float(x @ w.T)
    # standard error from Prop. 1 at m = draws: sqrt((e^{2 sigma^2} - 1) / m) bounds both channels
    sd = math.sqrt(math.expm1(s * float((x + w).pow(2).sum())) / draws)
    assert abs(float(cos) - math.cos(s * t)) < 5 * sd
    assert abs(float(sin) - math.sin(s * t)) < 5 * sd


def test_cos_sin_variance_matches_proposition_1():
    x, w = _pair()
    s = 1.7
    t = float(x @ w.T)
    sigma2 = s / 2 * float((x + w).pow(2).sum())
    big_h = s / 2 * float(x.pow(2).sum() + w.pow(2).sum())
    second_c = 0.5 * (math.exp(2 * sigma2) + math.cos(4 * sigma2 - 2 * big_h))
    second_s = 0.5 * (math.exp(2 * sigma2) - math.cos(4 * sigma2 - 2 * big_h))
    var_c, var_s = second_c - math.cos(s * t) ** 2, second_s - math.sin(s * t) ** 2
    m, seeds = 4, 50_000
    gen = torch.Generator().manual_seed(1)
    estimates = []
    for _ in range(seeds // 5000):
        omega = torch.randn(5000, m, 3, dtype=torch.float64, generator=gen)
        freq = torch.full((m,), s, dtype=torch.float64)
        xr, xi = complex_exponential_features(x.expand(5000, 1, 3), omega, freq)
        wr, wi = complex_exponential_features(w.expand(5000, 1, 3), omega, freq)
        c = ((xr * wr - xi * wi).mean(-1)).squeeze(-1)
        sn = ((xr * wi + xi * wr).mean(-1)).squeeze(-1)
        estimates.append(torch.stack([c, sn], -1))
    est = torch.cat(estimates)
    assert float(est[:, 0].var()) == pytest.approx(var_c / m, rel=0.08)
    assert float(est[:, 1].var()) == pytest.approx(var_s / m, rel=0.08)
    # the sum of both variances is (e^{2 sigma^2} - 1) / m (Eq. 13)
    assert (var_c + var_s) == pytest.approx(math.exp(2 * sigma2) - 1, rel=1e-12)


def test_product_features_are_unbiased_for_every_monomial():
    x = torch.tensor([0.6, -0.3, 0.8], dtype=torch.float64)
    w = torch.tensor([0.2, 0.9, -0.5], dtype=torch.float64)
    t = float(x @ w)
    gen = torch.Generator().manual_seed(2)
    m = 400_000
    mats = [torch.randn(m, 3, dtype=torch.float64, generator=gen) for _ in range(3)]
    fx, fw = product_features(x, mats), product_features(w, mats)
    for n in range(1, 4):
        estimate = float((fx[n - 1] * fw[n - 1]).mean())
        # variance per draw (||x||^2 ||w||^2 + 2 t^2)^n (Prop. 2)
        sd = math.sqrt((float(x @ x) * float(w @ w) + 2 * t**2) ** n / m)
        assert abs(estimate - t**n) < 5 * sd
