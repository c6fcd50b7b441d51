"""The FeatureMap contract of DESIGN.md: every component with every weight matrix, masks, errors, registry."""

import pytest
import torch

import rf_features
import rf_matrices
from rf_features import FeatureMap

COMPONENTS = ["gerf", "oprf", "posrf", "posrf-hyp", "saderf", "trigrf"]
MATRICES = rf_matrices.names()


def test_every_paper_component_is_registered():
    assert set(COMPONENTS) <= set(rf_features.names())
    assert rf_features.names("pos*") == ["posrf", "posrf-hyp"]


def test_unknown_component_error_lists_the_known_names():
    with pytest.raises(ValueError, match=r"(?s)unknown component function 'relu'.*\n  gerf, oprf"):
        rf_features.create("relu", dim=4)


@pytest.mark.parametrize("matrix", MATRICES)
@pytest.mark.parametrize("name", COMPONENTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_every_component_and_matrix_pair_runs_forward_and_backward(name, matrix, dtype):
    fm = rf_features.create(name, weight_matrix=matrix, num_features=16, dim=8, seed=0)
    q = (torch.randn(2, 2, 5, 8) * 0.5).to(dtype).requires_grad_()
    k = (torch.randn(2, 2, 7, 8) * 0.5).to(dtype).requires_grad_()
    phi_q, phi_k = fm(q, k, stabilize=True)
    assert phi_q.shape == (2, 2, 5, fm.feature_width)
    assert phi_k.shape == (2, 2, 7, fm.feature_width)
    assert phi_q.dtype == phi_k.dtype == dtype
    (phi_q.float() @ phi_k.float().mT).sum().backward()
    assert torch.isfinite(q.grad).all()
    assert torch.isfinite(k.grad).all()


@pytest.mark.parametrize("name", COMPONENTS)
def test_fastfoodl_parameters_get_gradients_through_every_component(name):
    fm = rf_features.create(
        name, weight_matrix="fastfoodl", num_features=16, dim=8, seed=0, matrix_options={"learn_gb": True}
    )
    q, k = torch.randn(1, 6, 8) * 0.5, torch.randn(1, 6, 8) * 0.5
    phi_q, phi_k = fm(q, k)
    (phi_q @ phi_k.mT).sum().backward()
    for pname, p in fm.weight_matrix.named_parameters():
        assert p.grad is not None, pname
        assert p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name", COMPONENTS)
def test_padded_keys_take_no_part_in_statistics_or_stabilizers(name):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 6, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, 6, 8, generator=g, dtype=torch.float64)
    mask = torch.tensor([[False] * 4 + [True] * 2, [False] * 6])
    fm = rf_features.create(
        name, weight_matrix="orf", num_features=16, dim=8, seed=0, matrix_options={"dtype": torch.float64}
    )
    phi_q, phi_k = fm(q, k, key_padding_mask=mask, query_padding_mask=mask, stabilize=True)
    changed_q, changed_k = q.clone(), k.clone()
    changed_q[0, :, 4:] = 50.0
    changed_k[0, :, 4:] = -50.0
    phi_q2, phi_k2 = fm(changed_q, changed_k, key_padding_mask=mask, query_padding_mask=mask, stabilize=True)
    torch.testing.assert_close(phi_q2[0, :, :4], phi_q[0, :, :4])
    torch.testing.assert_close(phi_k2, phi_k)
    assert (phi_k[0, :, 4:] == 0).all()


def test_mask_of_all_padding_keeps_features_finite():
    fm = rf_features.create("oprf", num_features=16, dim=8, seed=0)
    q, k = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    mask = torch.ones(2, 5, dtype=torch.bool)
    phi_q, phi_k = fm(q, k, key_padding_mask=mask, query_padding_mask=mask, stabilize=True)
    assert torch.isfinite(phi_q).all()
    assert (phi_k == 0).all()


def test_bad_inputs_name_the_argument():
    fm = rf_features.create("posrf", num_features=16, dim=8, seed=0)
    with pytest.raises(ValueError, match=r"q: expected shape \(\.\.\., n, 8\), got \(2, 5, 4\)"):
        fm(torch.randn(2, 5, 4), torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match="q, k: expected the same leading"):
        fm(torch.randn(2, 5, 8), torch.randn(3, 5, 8))
    with pytest.raises(ValueError, match=r"key_padding_mask: expected a bool tensor of shape \(B, n\)"):
        fm(torch.randn(2, 5, 8), torch.randn(2, 5, 8), key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="kernel: expected one of"):
        rf_features.create("posrf", dim=8, kernel="laplace")
    with pytest.raises(ValueError, match="a: expected A < 1/4"):
        rf_features.create("gerf", dim=8, a=0.3)
    with pytest.raises(ValueError, match=r"a: expected a real A .* got \(-0\.1\+0\.1j\)"):
        rf_features.create("gerf", dim=8, a=-0.1 + 0.1j)
    with pytest.raises(ValueError, match="weight_matrix: expected sigma=1"):
        rf_features.create("posrf", dim=8, weight_matrix=rf_matrices.create("orf", 16, 8, sigma=2.0))
    with pytest.raises(ValueError, match="weight_matrix: expected dim 8"):
        rf_features.create("posrf", dim=8, weight_matrix=rf_matrices.create("orf", 16, 4))


@pytest.mark.parametrize(
    ("name", "matrix", "rows", "width"),
    [("posrf", "orf", 32, 32), ("trigrf", "orf", 32, 64), ("posrf-hyp", "orf", 32, 64),
     ("oprf", "sgq", 33, 33), ("trigrf", "sgq", 9, 18)],
)  # fmt: skip
def test_feature_width_counts_components_per_row(name, matrix, rows, width):
    fm = rf_features.create(name, weight_matrix=matrix, num_features=rows, dim=8)
    assert (fm.num_features, fm.feature_width) == (rows, width)


def test_redraw_changes_the_features_and_a_seed_reproduces_them():
    fm = rf_features.create("oprf", num_features=16, dim=8, seed=3)
    q, k = torch.randn(1, 4, 8), torch.randn(1, 4, 8)
    first = fm(q, k)[0]
    fm.redraw()
    assert not torch.equal(fm(q, k)[0], first)
    fm.redraw(seed=3)
    torch.testing.assert_close(fm(q, k)[0], first)


def test_user_registers_a_component_without_editing_the_package():
    @rf_features.register("test-relu")
    class ReLUFeatures(FeatureMap):
        """relu(omega . x) features (not a softmax-kernel estimate; a registry test)."""

        def log_features(self, projection, sqnorm, stats, is_query):
            return torch.zeros_like(projection), torch.relu(projection)

    try:
        fm = rf_features.create("test-relu", weight_matrix="qmc", num_features=8, dim=4, seed=0)
        phi_q, _ = fm(torch.randn(3, 4), torch.randn(3, 4))
        assert (phi_q >= 0).all()
    finally:
        rf_features.COMPONENTS.unregister("test-relu")
