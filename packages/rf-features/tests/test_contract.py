"""``FeatureMap.contract``: the closed form the attention kernels differentiate by hand, or a callable."""

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
def test_the_closed_form_equals_the_forward_features(name, matrix, kernel):
    # in float64: the two forms sum in other orders, and nothing here needs float32's rounding
    fm = rf_features.create(name, weight_matrix=matrix, num_features=8, dim=4, seed=0, kernel=kernel).double()
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64) for _ in range(2))
    scale = 0.7
    closed = fm.contract(q, k, scale=scale)
    generic = fm.contract(q, k, scale=scale, closed_form=False)
    assert (closed.closed, generic.closed) == (True, False)
    assert closed.width == generic.width == fm.feature_width
    assert closed.query is not None
    assert closed.signed == generic.signed == (closed.query.trigonometric or closed.query.sign is not None)
    expected = fm(q * scale, k * scale)  # the exact features, with no stabilizer
    for is_query, x, want, form in (
        (True, q, expected[0], closed.query),
        (False, k, expected[1], closed.key),
    ):
        assert form is not None
        torch.testing.assert_close(closed_form_features(form, x), want, rtol=1e-12, atol=1e-14)
        log_x, mult = generic.log_features(x, is_query)
        torch.testing.assert_close(torch.exp(log_x) * (1 if mult is None else mult), want, rtol=1e-12, atol=0)


class Cubic(FeatureMap):
    """A component whose log-features are not affine in the projection: no closed form."""

    positive = True

    def log_features(self, projection, sqnorm, stats, is_query):
        return projection - projection.pow(3) / 10 - sqnorm / 2, None


def test_a_map_without_a_log_form_gives_the_callable():
    fm = Cubic(4, num_features=8, seed=0)
    q, k = torch.randn(1, 3, 4), torch.randn(1, 3, 4)
    contract = fm.contract(q, k, scale=0.5)
    assert (contract.closed, contract.query, contract.key) == (False, None, None)
    assert (contract.width, contract.signed) == (8, False)
    log_q, mult = contract.log_features(q, True)
    assert mult is None
    torch.testing.assert_close(torch.exp(log_q), fm(q * 0.5, k * 0.5)[0])


def test_a_contract_holds_exactly_one_strategy():
    form = rf_features.create("posrf", num_features=4, dim=2).contract(torch.randn(3, 2), torch.randn(3, 2))
    with pytest.raises(ValueError, match="either both closed forms"):
        rf_features.FeatureContract(
            4, False, query=form.query, key=form.key, log_features=lambda x, q: (x, None)
        )
    with pytest.raises(ValueError, match="either both closed forms"):
        rf_features.FeatureContract(4, False, query=form.query)
