"""Exact RBF kernel and its TrigRF estimate from any weight matrix (Eq. 9-11)."""

from __future__ import annotations

import torch

from rf_matrices.weight_matrix import WeightMatrix


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor, sigma: float = 1.0) -> torch.Tensor:
    r"""The RBF kernel $\exp(-\lVert x_i - y_j \rVert^2 / (2 \sigma^2))$.

    ``x (..., n, d)``, ``y (..., m, d)`` -> ``(..., n, m)``.
    """
    return torch.exp(-torch.cdist(x, y).pow(2) / (2 * sigma**2))


def trig_kernel_estimate(weight_matrix: WeightMatrix, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    r"""TrigRF estimate of the RBF kernel, $\sum_i a_i \cos(\omega_i^\top (x - y))$ (Eq. 10, real part).

    $a_i$ are the matrix's ``component_weights``, or ``1 / s`` for Monte Carlo matrices. This is the
    estimate that makes a matrix a weight matrix (Definition 3.1).

    Args:
        weight_matrix: any [`WeightMatrix`][rf_matrices.WeightMatrix] with bandwidth sigma.
        x: ``(..., n, d)``.
        y: ``(..., m, d)``.

    Returns:
        ``(..., n, m)``, estimating ``gaussian_kernel(x, y, weight_matrix.sigma)``.
    """
    px, py = weight_matrix(x), weight_matrix(y)
    a = weight_matrix.component_weights
    a = px.new_full((px.shape[-1],), 1 / px.shape[-1]) if a is None else a.to(px.dtype)
    return (torch.cos(px) * a) @ torch.cos(py).mT + (torch.sin(px) * a) @ torch.sin(py).mT


@torch.no_grad()
def relative_kernel_error(weight_matrix: WeightMatrix, x: torch.Tensor, y: torch.Tensor) -> float:
    """``||K_hat - K||_F / ||K||_F`` of the TrigRF estimate against the exact RBF kernel on ``x, y``."""
    exact = gaussian_kernel(x, y, weight_matrix.sigma)
    error = trig_kernel_estimate(weight_matrix, x, y) - exact
    return float(error.norm() / exact.norm())
