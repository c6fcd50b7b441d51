"""Component functions over the quadrature matrix ``sgq``: the rule each one gets, positivity, accuracy."""

import warnings

import pytest
import torch

import rf_features
from rf_features import softmax_kernel
from spectraformer_core.testing import relative_error

POSITIVE = {"posrf": {}, "posrf-hyp": {}, "gerf": {"a": -0.1}, "oprf": {}, "saderf": {}}


def attention_inputs(sigma, dim=32, n=128, seed=0):
    """``q, k ~ N(0, sigma^2 I)`` scaled by ``dim^-1/4`` as attention scales them, ``(2, 2, n, dim)``."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, n, dim, generator=g, dtype=torch.float64) * sigma * dim**-0.25
    k = torch.randn(2, 2, n, dim, generator=g, dtype=torch.float64) * sigma * dim**-0.25
    return q, k


@pytest.mark.parametrize("name", list(POSITIVE))
def test_positive_component_over_sgq_has_positive_features_and_normalizers(name):
    q, k = attention_inputs(1.5)
    for seed in range(5):
        fm = rf_features.create(
            name,
            weight_matrix="sgq",
            num_features=128,
            dim=32,
            seed=seed,
            matrix_options={"dtype": torch.float64},
            **POSITIVE[name],
        )
        phi_q, phi_k = fm(q, k, stabilize=True)
        assert (phi_q >= 0).all(), (name, seed)
        assert (phi_k >= 0).all(), (name, seed)
        normalizer = phi_q @ phi_k.sum(-2, keepdim=True).mT  # (B, H, n, 1): sum_j phi_q,i . phi_k,j
        assert (normalizer > 0).all(), (name, seed, int((normalizer <= 0).sum()))


@pytest.mark.parametrize("name", rf_features.names())
def test_sgq_keeps_antipodal_pairs_unless_the_component_estimate_is_even_in_omega(name):
    fm = rf_features.create(name, weight_matrix="sgq", num_features=32, dim=8, seed=0)
    assert fm.weight_matrix.rule == "stiefel"
    assert fm.weight_matrix.antipodal == (name not in ("trigrf", "posrf-hyp"))
    assert (
        rf_features.create("gerf", s=-1, weight_matrix="sgq", num_features=8, dim=8).weight_matrix.antipodal
        is False
    )


def test_folded_rule_gives_the_antipodal_rules_estimate_for_even_components():
    # TrigRF's cos(omega.(q - k)) and PosRF-Hyp's cosh(omega.(q + k)) are even in omega: s nodes and
    # the 2s nodes with their antipodes give the same estimate.
    q, k = attention_inputs(1.0, dim=8, n=6)
    for name in ("trigrf", "posrf-hyp"):
        folded = rf_features.create(
            name, weight_matrix="sgq", num_features=12, dim=8, seed=0, matrix_options={"dtype": torch.float64}
        )
        omega = folded.weight_matrix.matrix()
        doubled = rf_features.create(
            name, weight_matrix="sgq", num_features=24, dim=8, matrix_options={"dtype": torch.float64}
        )
        doubled.weight_matrix.weight.copy_(torch.cat((omega, -omega)))
        phi_q, phi_k = folded(q, k)
        phi_q2, phi_k2 = doubled(q, k)
        torch.testing.assert_close(phi_q @ phi_k.mT, phi_q2 @ phi_k2.mT)


def positive_over_smolyak(name):
    """``name`` over the signed Smolyak rule (whose weights can be negative), d = 8, 17 rows."""
    return rf_features.create(
        name,
        weight_matrix="sgq",
        num_features=17,
        dim=8,
        matrix_options={"rule": "smolyak"},
        **POSITIVE[name],
    )


@pytest.mark.parametrize("name", list(POSITIVE))
def test_positive_component_over_a_signed_rule_warns_once_at_construction(name):
    with pytest.warns(UserWarning, match=r"weight_matrix: .*can be negative.*rule='stiefel'") as record:
        positive_over_smolyak(name)
    assert len(record) == 1


@pytest.mark.parametrize("name", list(POSITIVE))
def test_positive_component_over_a_signed_rule_does_not_warn_again_in_forward(name):
    q, k = attention_inputs(1.0, dim=8, n=4)
    with pytest.warns(UserWarning, match="can be negative"):
        fm = positive_over_smolyak(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fm(q.float(), k.float())
        fm(q.float(), k.float())
    assert [str(w.message) for w in caught] == []


def test_signed_rules_do_not_warn_for_signed_components():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rf_features.create(
            "trigrf", weight_matrix="sgq", num_features=17, dim=8, matrix_options={"rule": "smolyak"}
        )
        rf_features.create(
            "gerf",
            s=-1,
            weight_matrix="sgq",
            num_features=17,
            dim=8,
            matrix_options={"rule": "spherical-radial"},
        )
    assert [str(w.message) for w in caught] == []


@pytest.mark.parametrize("name", [*POSITIVE, "trigrf"])
def test_sgq_estimate_is_at_least_as_accurate_as_iid_gaussian_rows_at_equal_count(name):
    # Median over draws of the relative MSE: positive estimators are heavy-tailed, a mean of a few draws
    # measures its largest draw.
    q, k = attention_inputs(0.5, dim=16, n=32)
    q, k = q[0, 0], k[0, 0]
    exact = softmax_kernel(q, k)

    def median_error(matrix):
        errors = []
        for seed in range(15):
            fm = rf_features.create(
                name,
                weight_matrix=matrix,
                num_features=64,
                dim=16,
                seed=seed,
                matrix_options={"dtype": torch.float64},
                **POSITIVE.get(name, {}),
            )
            phi_q, phi_k = fm(q, k)
            errors.append(relative_error(phi_q @ phi_k.mT, exact) ** 2)
        return float(torch.tensor(errors).median())

    sgq, base = median_error("sgq"), median_error("base")
    assert sgq <= base, (sgq, base)
