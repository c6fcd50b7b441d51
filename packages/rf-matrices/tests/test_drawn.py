"""Learnable and per-head weight matrices (``create(..., learnable=True, num_heads=H)``)."""

import pytest
import torch

import rf_matrices

ALL = ["base", "fastfood", "fastfoodl", "mm", "orf", "qmc", "sgq", "sorf"]


@pytest.mark.parametrize("name", ALL)
def test_learnable_matrix_is_one_parameter_equal_to_the_draw_of_its_source(name):
    drawn = rf_matrices.create(name, 16, 8, seed=3, learnable=True, dtype=torch.float64)
    plain = rf_matrices.create(name, 16, 8, seed=3, dtype=torch.float64)
    assert [n for n, _ in drawn.named_parameters()] == ["weight"]
    torch.testing.assert_close(drawn.matrix().detach(), plain.matrix().detach())


@pytest.mark.parametrize("name", ["orf", "sorf"])
def test_every_heads_orf_rows_start_orthogonal_within_a_block(name):
    w = rf_matrices.create(name, 8, 8, seed=0, learnable=True, num_heads=3, dtype=torch.float64)
    gram = w.matrix() @ w.matrix().mT  # (H, 8, 8)
    off_diagonal = gram - torch.diag_embed(torch.diagonal(gram, dim1=-2, dim2=-1))
    assert off_diagonal.abs().max() < 1e-10


def test_heads_are_independent_draws():
    w = rf_matrices.create("orf", 8, 4, seed=0, learnable=True, num_heads=2).matrix()
    assert not torch.allclose(w[0], w[1])


def test_per_head_forward_applies_each_heads_matrix_to_its_head():
    w = rf_matrices.create("base", 6, 4, seed=0, num_heads=3, dtype=torch.float64)
    x = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    y = w(x)
    for h in range(3):
        torch.testing.assert_close(y[:, h], x[:, h] @ w.matrix()[h].T)


def test_per_head_forward_refuses_inputs_with_another_head_count():
    w = rf_matrices.create("orf", 6, 4, seed=0, learnable=True, num_heads=3)
    with pytest.raises(ValueError, match="num_heads=3"):
        w(torch.randn(2, 2, 5, 4))


def test_redraw_leaves_a_learnable_matrix_unchanged():
    w = rf_matrices.create("orf", 8, 4, seed=0, learnable=True, num_heads=2)
    before = w.matrix().detach().clone()
    w.redraw(seed=5)
    assert torch.equal(w.matrix(), before)


def test_redraw_draws_every_head_of_a_fixed_per_head_matrix_afresh():
    w = rf_matrices.create("orf", 8, 4, seed=0, num_heads=2)
    before = w.matrix().clone()
    w.redraw(seed=5)
    assert not torch.allclose(w.matrix()[0], before[0])
    assert not torch.allclose(w.matrix()[1], before[1])


def test_quadrature_matrix_keeps_its_component_weights_for_every_head():
    plain = rf_matrices.create("sgq", 17, 8, seed=0, rule="smolyak")
    drawn = rf_matrices.create("sgq", 17, 8, seed=0, rule="smolyak", learnable=True, num_heads=2)
    assert drawn.component_weights is not None
    assert plain.component_weights is not None
    torch.testing.assert_close(drawn.component_weights, plain.component_weights)
    assert drawn.signed_weights


def test_per_head_rule_with_random_weights_is_refused():
    with pytest.raises(ValueError, match="random quadrature weights"):
        rf_matrices.create("sgq", 17, 8, seed=0, rule="spherical-radial", learnable=True, num_heads=2)


def test_fixed_per_head_copies_of_a_learned_matrix_are_refused():
    with pytest.raises(ValueError, match="learnable=True"):
        rf_matrices.create("fastfoodl", 8, 4, seed=0, num_heads=2)


def test_learnable_matrix_and_its_gradient_stay_float32_under_bfloat16_autocast():
    w = rf_matrices.create("orf", 8, 4, seed=0, learnable=True, num_heads=2)
    x = torch.randn(3, 2, 5, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = w(x)
    y.float().sum().backward()
    assert w.weight.dtype == torch.float32
    assert w.weight.grad is not None
    assert w.weight.grad.dtype == torch.float32
