"""Unit-cube sampling weight matrices: QMC (Section 3.1.5) and moment matching, MM (Section 3.1.6)."""

from __future__ import annotations

from typing import Any

import torch

from rf_matrices.registry import register
from rf_matrices.weight_matrix import DenseWeightMatrix

#: Sobol points are clamped to [EPS, 1 - EPS] before the inverse normal CDF, so no entry is infinite
#: (|omega| <= 6.4, a quantile the Gaussian exceeds with probability 1.6e-10).
EPS = 1e-10


def scrambled_sobol_normal(count: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    r"""``count`` scrambled Sobol points in $[0, 1]^\text{dim}$ mapped through $\Phi^{-1}$ (Eq. 16), float64.

    The scrambling seed is drawn from ``generator``, so the points are reproducible from it.
    """
    seed = int(torch.randint(0, 2**31 - 1, (), generator=generator, device=generator.device))
    engine = torch.quasirandom.SobolEngine(dimension=dim, scramble=True, seed=seed)
    t = engine.draw(count, dtype=torch.float64)
    return torch.special.ndtri(t.clamp(EPS, 1 - EPS)).to(generator.device)


@register("qmc")
class QMC(DenseWeightMatrix):
    r"""Quasi-Monte Carlo rows $\omega_i = \Phi^{-1}(t_i) / \sigma$ (Eq. 16, Avron et al. 2016).

    $t_1, \dots, t_s$ are the first $s$ points of an Owen-scrambled Sobol sequence in $d$ dimensions (one
    point per row; seeded by the generator) and $\Phi^{-1}$ the standard normal quantile, applied per
    coordinate. The Sobol sequence is balanced when ``s`` is a power of two. ``d`` is at most 21201.
    """

    def sample(self) -> torch.Tensor:
        """``(s, d)`` Gaussian quantiles of scrambled Sobol points."""
        return scrambled_sobol_normal(self.num_features, self.dim, self.generator)


@register("mm")
class MM(DenseWeightMatrix):
    """Moment-matched QMC rows ``A^-1 (Phi^-1(t_i) - mu) / sigma`` (Section 3.1.6, Shen et al. 2017).

    ``mu`` is the sample mean of the QMC rows and ``A = C^(1/2)`` the symmetric square root of their sample
    covariance ``C = (1/s) sum (z_i - mu)(z_i - mu)^T``, so the rows have sample mean exactly 0 and
    ``W.T @ W / s = I / sigma^2`` exactly. This needs ``s > d``; for ``2 <= s <= d`` the covariance is
    singular and only the mean and the per-coordinate variances are matched.
    """

    def __init__(self, num_features: int, dim: int, **kw: Any) -> None:
        if num_features == 1:
            raise ValueError("num_features: mm needs at least 2 rows to match a mean and a variance, got 1")
        super().__init__(num_features, dim, **kw)

    def sample(self) -> torch.Tensor:
        """``(s, d)`` moment-matched rows."""
        z = scrambled_sobol_normal(self.num_features, self.dim, self.generator)
        z = z - z.mean(dim=0)
        if self.num_features <= self.dim:
            return z / z.pow(2).mean(dim=0).sqrt()
        evals, evecs = torch.linalg.eigh(z.mT @ z / self.num_features)
        inv_sqrt = evecs @ torch.diag(evals.rsqrt()) @ evecs.mT
        return z @ inv_sqrt
