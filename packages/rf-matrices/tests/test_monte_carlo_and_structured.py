"""ORF (Eq. 14), SORF (Eq. 15), FastFood (Eq. 13) and FastFood_L against their dense definitions."""

import math

import pytest
import torch

import rf_matrices
from rf_matrices import hadamard_matrix


def test_orf_rows_within_a_block_are_orthogonal():
    d = 16
    w = rf_matrices.create("orf", 3 * d + 5, d, seed=0, dtype=torch.float64).matrix()
    for block in (w[:d], w[d : 2 * d], w[2 * d : 3 * d], w[3 * d :]):
        directions = block / block.norm(dim=1, keepdim=True)
        gram = directions @ directions.T
        torch.testing.assert_close(gram, torch.eye(len(block), dtype=torch.float64))


def test_orf_row_norms_follow_the_chi_distribution_of_gaussian_rows():
    d, sigma = 8, 0.5
    w = rf_matrices.create("orf", 4000, d, sigma=sigma, seed=0, dtype=torch.float64).matrix()
    sq = (w * sigma).norm(dim=1).pow(2)  # chi-square(d): mean d, variance 2d
    assert abs(sq.mean().item() - d) < 4 * math.sqrt(2 * d / 4000)
    assert abs(sq.var().item() - 2 * d) < 0.15 * 2 * d


def sorf_dense(w: rf_matrices.SORF) -> torch.Tensor:
    """W from Eq. 15 with dense matrices: sqrt(d') / sigma * H D1 H D2 H D3 per block."""
    h = hadamard_matrix(w.padded_dim)
    blocks = [
        h @ torch.diag(d1) @ h @ torch.diag(d2) @ h @ torch.diag(d3)
        for d1, d2, d3 in w.signs.double().unbind(1)
    ]
    full = torch.cat(blocks) * math.sqrt(w.padded_dim) / w.sigma
    return full[: w.num_features, : w.dim]


@pytest.mark.parametrize("fast", [True, False], ids=["transform", "dense"])
@pytest.mark.parametrize("dim", [16, 20, 2048], ids=["power-of-two", "padded", "radix-32-twice"])
def test_sorf_fast_transform_equals_the_dense_product_in_float64(dim, fast):
    w = rf_matrices.create("sorf", 70, dim, sigma=1.3, seed=0, dtype=torch.float64, fast_transform=fast)
    x = torch.randn(4, dim, dtype=torch.float64)
    torch.testing.assert_close(w(x), x @ sorf_dense(w).T)


def test_sorf_rows_have_gaussian_norms():
    # d a power of two: every row has norm exactly sqrt(d) / sigma.
    w = rf_matrices.create("sorf", 64, 32, sigma=2.0, seed=0, dtype=torch.float64).matrix()
    torch.testing.assert_close(w.norm(dim=1), torch.full((64,), math.sqrt(32) / 2.0, dtype=w.dtype))
    # padded d: the mean squared row norm is d / sigma^2, as for Gaussian rows.
    w = rf_matrices.create("sorf", 4096, 20, sigma=2.0, seed=0, dtype=torch.float64).matrix()
    assert abs(w.norm(dim=1).pow(2).mean().item() - 20 / 4) < 0.1


def fastfood_dense(w: rf_matrices.FastFood) -> torch.Tensor:
    """W from Eq. 13 with dense matrices: 1 / (sigma sqrt(d')) S H G Pi H B, H unnormalized."""
    n = w.padded_dim
    h = hadamard_matrix(n) * math.sqrt(n)
    blocks = []
    for s, g, b, perm in zip(w.scale, w.gaussian, w.binary, w.permutation, strict=True):
        pi = torch.zeros(n, n, dtype=torch.float64)
        pi[torch.arange(n), perm] = 1.0
        s, g, b = (t.detach().double() for t in (s, g, b))
        blocks.append(torch.diag(s) @ h @ torch.diag(g) @ pi @ h @ torch.diag(b))
    full = torch.cat(blocks) / (w.sigma * math.sqrt(n))
    return full[: w.num_features, : w.dim]


@pytest.mark.parametrize("fast", [True, False], ids=["transform", "dense"])
@pytest.mark.parametrize("name", ["fastfood", "fastfoodl"])
@pytest.mark.parametrize("dim", [16, 20], ids=["power-of-two", "padded"])
def test_fastfood_fast_transform_equals_the_dense_product_in_float64(name, dim, fast):
    w = rf_matrices.create(name, 70, dim, sigma=0.7, seed=0, dtype=torch.float64, fast_transform=fast)
    x = torch.randn(4, dim, dtype=torch.float64)
    torch.testing.assert_close(w(x), x @ fastfood_dense(w).T)


def test_fastfood_rows_have_exactly_chi_norms_and_gaussian_second_moment():
    d = 16
    w = rf_matrices.create("fastfood", 4096, d, seed=0, dtype=torch.float64)
    norms = w.matrix().norm(dim=1)
    chi = (w.scale * w.gaussian.norm(dim=1, keepdim=True)).reshape(-1)
    torch.testing.assert_close(norms, chi)  # S_ii = s_i / ||G||_F gives row norm s_i
    sq = norms.pow(2)
    assert abs(sq.mean().item() - d) < 4 * math.sqrt(2 * d / 4096)
    torch.testing.assert_close(
        w.matrix().T @ w.matrix() / 4096, torch.eye(d, dtype=torch.float64), atol=0.1, rtol=0
    )


def test_automatic_choice_takes_the_dense_product_for_small_dims_only():
    assert not rf_matrices.create("sorf", 64, 32).fast_transform
    assert rf_matrices.create("fastfood", 4096, 2048).fast_transform


@pytest.mark.parametrize("name", ["sorf", "fastfoodl"])
def test_transform_and_dense_paths_give_the_same_gradients(name):
    x = torch.randn(5, 12, dtype=torch.float64)
    grads = []
    for fast in (True, False):
        w = rf_matrices.create(name, 40, 12, seed=0, dtype=torch.float64, fast_transform=fast)
        xi = x.clone().requires_grad_()
        w(xi).square().sum().backward()
        grads.append([xi.grad, *[p.grad for p in w.parameters()]])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


def test_fastfoodl_parameters_receive_gradients():
    w = rf_matrices.create("fastfoodl", 32, 8, seed=0, learn_gb=True)
    assert {n for n, _ in w.named_parameters()} == {"scale", "gaussian", "binary"}
    w(torch.randn(5, 8)).square().sum().backward()
    for name, p in w.named_parameters():
        assert p.grad is not None, name
        assert p.grad.abs().sum() > 0, name
    only_s = rf_matrices.create("fastfoodl", 32, 8, seed=0)
    assert [n for n, _ in only_s.named_parameters()] == ["scale"]


@pytest.mark.parametrize("learn_gb", [False, True], ids=["S", "SGB"])
def test_fastfoodl_adam_steps_reduce_a_kernel_fit_loss(learn_gb):
    # Fit the RBF kernel of bandwidth 0.5 starting from a FastFood drawn for bandwidth 1.
    d = 8
    x = torch.randn(64, d, generator=torch.Generator().manual_seed(0)) * 0.5 / d**0.5
    target = rf_matrices.gaussian_kernel(x, x, sigma=0.5)
    w = rf_matrices.create("fastfoodl", 128, d, seed=0, learn_gb=learn_gb)
    optimizer = torch.optim.Adam(w.parameters(), lr=0.05)

    def loss():
        return (rf_matrices.trig_kernel_estimate(w, x, x) - target).pow(2).mean()

    initial = loss().item()
    for _ in range(60):
        optimizer.zero_grad()
        value = loss()
        value.backward()
        optimizer.step()
    assert loss().item() < 0.2 * initial
