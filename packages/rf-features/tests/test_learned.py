"""The learned feature maps (Hedgehog/LoLCATs, T2R): their formulas, starts, registry and refusals."""

import pytest
import torch

import rf_features

B, H, N, D = 2, 3, 7, 4


def inputs(dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(B, H, N, D, generator=torch.Generator().manual_seed(0), dtype=dtype)


def test_learned_maps_are_not_components_and_pair_with_no_matrix():
    assert rf_features.learned_names() == ["hedgehog", "t2r"]
    assert not set(rf_features.learned_names()) & set(rf_features.names())


@pytest.mark.parametrize("s", [2, D, 6])
def test_hedgehog_features_are_both_halves_softmax_over_features_of_the_projection(s):
    fm = rf_features.create("hedgehog", num_features=s, dim=D, seed=0, num_heads=H).double()
    with torch.no_grad():
        fm.weight_matrix.weight.add_(0.3 * torch.randn(H, s, D, generator=torch.Generator().manual_seed(1)))
    x = inputs()
    phi_q, phi_k = fm(x, x)
    projection = torch.einsum("bhnd,hsd->bhns", x, fm.weight_matrix.weight.detach())
    expected = torch.cat((projection.softmax(-1), (-projection).softmax(-1)), dim=-1)
    assert phi_q.shape == (B, H, N, 2 * s)
    assert (fm.num_features, fm.feature_width) == (s, 2 * s)
    torch.testing.assert_close(phi_q, expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(phi_k, expected, rtol=1e-12, atol=0)
    assert bool((phi_q > 0).all())


def test_hedgehog_starts_at_the_identity_and_its_extra_rows_differ():
    fm = rf_features.create("hedgehog", num_features=D + 3, dim=D, seed=0, num_heads=H)
    weight = fm.weight_matrix.weight.detach()
    assert torch.equal(weight[:, :D], torch.eye(D).expand(H, D, D))
    extra = weight[:, D:]
    assert bool((extra.norm(dim=-1) > 0.2).all())
    assert all(not torch.equal(extra[:, i], extra[:, j]) for i in range(3) for j in range(i))


def test_t2r_features_are_relu_of_the_affine_projection():
    fm = rf_features.create("t2r", num_features=5, dim=D, seed=0, num_heads=H).double()
    with torch.no_grad():
        fm.bias.copy_(torch.randn(H, 1, 5, generator=torch.Generator().manual_seed(2)))
    x = inputs()
    phi_q, phi_k = fm(x, x)
    expected = torch.relu(
        torch.einsum("bhnd,hsd->bhns", x, fm.weight_matrix.weight.detach()) + fm.bias.detach()
    )
    torch.testing.assert_close(phi_q, expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(phi_k, expected, rtol=1e-12, atol=0)
    assert bool((phi_q >= 0).all())
    assert bool((phi_q == 0).any())
    assert bool((phi_q > 0).any())


@pytest.mark.parametrize("name", ["hedgehog", "t2r"])
def test_learned_maps_train_their_projection(name):
    fm = rf_features.create(name, num_features=5, dim=D, seed=0, num_heads=H)
    x = inputs(torch.float32)
    phi_q, phi_k = fm(x, x)
    (phi_q * phi_k).sum().backward()
    assert fm.weight_matrix.weight.grad is not None
    assert bool(fm.weight_matrix.weight.grad.abs().sum() > 0)
    before = fm.weight_matrix.weight.detach().clone()
    fm.redraw()  # a learned map never redraws
    assert torch.equal(fm.weight_matrix.weight, before)


@pytest.mark.parametrize("name", ["hedgehog", "t2r"])
def test_a_fixed_or_gaussian_learned_map_is_refused(name):
    with pytest.raises(ValueError, match="learnable"):
        rf_features.create(name, num_features=4, dim=D, learnable=False)
    with pytest.raises(ValueError, match="kernel"):
        rf_features.create(name, num_features=4, dim=D, kernel="gaussian")
