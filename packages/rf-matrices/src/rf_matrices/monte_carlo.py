"""Dense Monte Carlo weight matrices: Base (Eq. 12) and ORF (Eq. 14)."""

from __future__ import annotations

import math

import torch

from rf_matrices.registry import register
from rf_matrices.weight_matrix import DenseWeightMatrix, chi_samples, haar_orthogonal


@register("base")
class Base(DenseWeightMatrix):
    r"""I.i.d. Gaussian rows, $W = P / \sigma$ with $P_{ij} \sim \mathcal{N}(0, 1)$.

    Eq. 12, Rahimi and Recht 2007.
    """

    def sample(self) -> torch.Tensor:
        """``(s, d)`` standard normal entries."""
        g = self.generator
        return torch.randn(self.num_features, self.dim, generator=g, dtype=torch.float64, device=g.device)


@register("orf")
class ORF(DenseWeightMatrix):
    r"""Orthogonal random features, $W = S Q / \sigma$ (Eq. 14, Yu et al. 2016).

    Independent Haar-distributed ``d x d`` orthogonal blocks ``Q`` are stacked until ``s`` rows (the last one
    truncated), and every row is rescaled by an independent chi(d) norm ``S_ii``, so each row is distributed
    exactly as a Gaussian row while rows within a block are exactly orthogonal.
    """

    def sample(self) -> torch.Tensor:
        """``(s, d)`` rows of the stacked, chi-rescaled orthogonal blocks."""
        s, d = self.num_features, self.dim
        blocks = haar_orthogonal(math.ceil(s / d), d, self.generator).reshape(-1, d)[:s]
        return blocks * chi_samples(s, d, self.generator).unsqueeze(-1)
