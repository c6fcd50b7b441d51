"""``FeatureMap.exponential_form``: the closed form the attention kernels differentiate by hand."""

import pytest
import torch

import rf_features
from rf_features import FeatureMap


def closed_form_features(form: rf_features.ExponentialForm, x: torch.Tensor) -> torch.Tensor:
    """The features of ``x (..., n, d)`` from the closed form, the plain way."""
    phases = x @ form.matrix.mT
    row = (x * x * form.square_weight.unsqueeze(-2)).sum(-1, keepdim=True)
    offset = form.offset.unsqueeze(-2)
    if form.trigonometric:
        features = torch.exp(row + offset) * torch.cat((phases.cos(), phases.sin()), dim=-1)
    else:
        features = torch.exp(phases + row + offset)
    return features if form.sign is None else features * form.sign


@pytest.mark.parametrize("kernel", ["softmax", "gaussian"])
@pytest.mark.parametrize("matrix", ["orf", "fastfoodl", "sgq"])
@pytest.mark.parametrize("name", sorted(rf_features.names()))
def test_exponential_form_equals_the_weighted_log_features(name, matrix, kernel):
    # in float64: the two forms sum in other orders, and nothing here needs float32's rounding
    fm = rf_features.create(name, weight_matrix=matrix, num_features=8, dim=4, seed=0, kernel=kernel).double()
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64) for _ in range(2))
    stats = fm.current_statistics(q, k)
    scale = 0.7
    for is_query, x in ((True, q), (False, k)):
        log_x, mult = fm.weighted_log_features(x * scale, stats, is_query=is_query, stabilized=True)
        expected = torch.exp(log_x) if mult is None else torch.exp(log_x) * mult
        form = fm.exponential_form(stats, is_query=is_query, dtype=torch.float64, scale=scale)
        assert form is not None
        torch.testing.assert_close(closed_form_features(form, x), expected, rtol=1e-12, atol=1e-14)


class Cubic(FeatureMap):
    """A component whose log-features are not affine in the projection: no closed form."""

    positive = True

    def log_features(self, projection, sqnorm, stats, is_query):
        return projection - projection.pow(3) / 10 - sqnorm / 2, None


class Rotated(rf_features.PosRF):
    """A map that overrides ``transform`` without saying its diagonal."""

    def transform(self, q, k, stats):
        return q.flip(-1), k.flip(-1)


@pytest.mark.parametrize("cls", [Cubic, Rotated], ids=["no-log-form", "custom-transform"])
def test_maps_without_a_closed_form_have_none(cls):
    fm = cls(4, num_features=8, seed=0)
    stats = fm.current_statistics(torch.randn(1, 3, 4), torch.randn(1, 3, 4))
    assert fm.exponential_form(stats, is_query=True, dtype=torch.float32) is None
