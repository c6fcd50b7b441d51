"""The exact kernels the feature maps estimate, and the error measure of the docs' table."""

from __future__ import annotations

import torch

from rf_features.feature_map import FeatureMap
from rf_matrices import gaussian_kernel

__all__ = ["gaussian_kernel", "relative_mse", "softmax_kernel"]


def softmax_kernel(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    r"""The softmax kernel $\exp(q_i^\top k_j)$ (Eq. 6 without the $1/\sqrt{d}$).

    ``q (..., n_q, d)``, ``k (..., n_k, d)`` -> ``(..., n_q, n_k)``.
    """
    return torch.exp(q @ k.mT)


@torch.no_grad()
def relative_mse(feature_map: FeatureMap, q: torch.Tensor, k: torch.Tensor) -> float:
    """``mean((K_hat - K)^2) / mean(K^2)`` of ``phi_q @ phi_k.mT`` against the map's exact kernel."""
    phi_q, phi_k = feature_map(q, k)
    exact = softmax_kernel(q, k) if feature_map.kernel == "softmax" else gaussian_kernel(q, k)
    return float((phi_q @ phi_k.mT - exact).pow(2).mean() / exact.pow(2).mean())
