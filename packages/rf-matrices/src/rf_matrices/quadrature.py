"""Quadrature weight matrices: Smolyak sparse-grid Gauss-Hermite rules, SGQ (Section 3.1.7)."""

from __future__ import annotations

import itertools
import math

import torch

from rf_matrices.registry import register
from rf_matrices.weight_matrix import DenseWeightMatrix, chi_samples, haar_orthogonal
from spectraformer_core import check_positive_int

#: Nodes closer than this are merged when the sparse grid is assembled.
_MERGE_TOL = 1e-9


def gauss_hermite(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``n``-point Gauss-Hermite rule for ``N(0, 1)``: nodes and weights (summing to 1), float64.

    Golub-Welsch: the nodes are the eigenvalues of the Jacobi matrix of the probabilists' Hermite
    polynomials (off-diagonal ``sqrt(k)``), the weights the squared first components of its eigenvectors.
    Exact for polynomials of degree <= ``2n - 1``. Made exactly symmetric (the middle node of an odd rule
    is exactly 0).
    """
    off = torch.arange(1, n, dtype=torch.float64).sqrt()
    nodes, vectors = torch.linalg.eigh(torch.diag(off, 1) + torch.diag(off, -1))
    weights = vectors[0] ** 2
    nodes = (nodes - nodes.flip(0)) / 2
    weights = (weights + weights.flip(0)) / 2
    return nodes, weights / weights.sum()


def smolyak_gauss_hermite(dim: int, degree: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The Smolyak sparse grid for ``N(0, I_dim)`` exact for polynomials of total degree <= ``degree``.

    Combination technique (Smolyak 1963; Gerstner and Griebel 1998) with the nested-by-level univariate rules
    ``U^l`` = Gauss-Hermite with ``2l - 1`` points (``U^1 = {0}``, ``U^2 = {0, +-sqrt(3)}``, ...): with
    ``q = (degree - 1) / 2``,
    ``A = sum_{max(0, q-d+1) <= |k| <= q} (-1)^(q-|k|) C(d-1, q-|k|) (U^(k_1+1) x ... x U^(k_d+1))``.
    Degree 3 gives the ``2d + 1`` points ``0, +-sqrt(3) e_i`` with weights ``1 - d/3`` and ``1/6``.

    Returns:
        ``(points (n, dim), weights (n,))`` in float64; weights sum to 1 and may be negative.
    """
    if degree < 1 or degree % 2 == 0:
        raise ValueError(f"degree: expected an odd integer >= 1, got {degree!r}")
    q = (degree - 1) // 2
    rules = [gauss_hermite(2 * level + 1) for level in range(q + 1)]
    points, weights = [], []
    for total in range(max(0, q - dim + 1), q + 1):
        coefficient = (-1) ** (q - total) * math.comb(dim - 1, q - total)
        for support, levels in _compositions(total, dim):
            nodes = [rules[k][0] for k in levels] or [torch.zeros(1, dtype=torch.float64)]
            node_weights = [rules[k][1] for k in levels] or [torch.ones(1, dtype=torch.float64)]
            grid = torch.cartesian_prod(*nodes).reshape(-1, len(nodes))
            block = torch.zeros(grid.shape[0], dim, dtype=torch.float64)
            block[:, support] = grid[:, : len(support)]
            points.append(block)
            weights.append(coefficient * torch.cartesian_prod(*node_weights).reshape(len(grid), -1).prod(-1))
    return _merge(torch.cat(points), torch.cat(weights))


def _compositions(total: int, dim: int):
    """Multi-indices ``k >= 0`` of ``dim`` entries summing to ``total``, as (support, nonzero values)."""
    if total == 0:
        yield [], []
        return
    for size in range(1, min(total, dim) + 1):
        for support in itertools.combinations(range(dim), size):
            for parts in _positive_parts(total, size):
                yield list(support), list(parts)


def _positive_parts(total: int, size: int):
    if size == 1:
        yield (total,)
        return
    for first in range(1, total - size + 2):
        for rest in _positive_parts(total - first, size - 1):
            yield (first, *rest)


def _merge(points: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum the weights of coinciding points and drop points whose weights cancel."""
    keys = torch.round(points / _MERGE_TOL).to(torch.int64)
    unique, inverse = torch.unique(keys, dim=0, return_inverse=True)
    merged = torch.zeros(unique.shape[0], dtype=torch.float64).index_add_(0, inverse, weights)
    first = torch.full((unique.shape[0],), points.shape[0], dtype=torch.int64)
    first = first.scatter_reduce(0, inverse, torch.arange(points.shape[0]), reduce="amin")
    keep = merged.abs() > 1e-13
    return points[first[keep]], merged[keep]


@register("sgq")
class SGQ(DenseWeightMatrix):
    """Sparse-grid quadrature rows with quadrature weights (Section 3.1.7, Dao et al. 2017).

    The rows are the nodes of the Smolyak sparse-grid Gauss-Hermite rule for ``N(0, I / sigma^2)`` (see
    [`smolyak_gauss_hermite`][rf_matrices.smolyak_gauss_hermite]) and
    [`component_weights`][rf_matrices.SGQ.component_weights] its weights: ``1 - d/3`` (negative for ``d > 3``)
    on the origin and ``1/6`` on ``+-sqrt(3) e_i`` at the default degree 3.

    One rule has a fixed number of nodes (``2d + 1`` at degree 3). To reach the requested ``s`` the rule is
    repeated: ``c = max(1, round((s - 1) / (2d)))`` copies share one origin node, the other weights divided by
    ``c``, and ``num_features`` reports the count actually used (``1 + 2dc``, at least ``2d + 1``).
    Copies of one fixed rule would all be the same, so each copy is

    - rotated by an independent Haar rotation (``rotate=True``): still exact for total degree <= 3, since
      the Gaussian is rotation invariant; and
    - at degree 3, with ``radius="random"`` (the default), stretched from radius ``sqrt(3)`` to an independent
      ``rho ~ chi(d + 2)``, with weights ``1 / (2 rho^2)`` on the ``2d`` nodes and ``1 - d / rho^2`` on the
      origin: the stochastic spherical-radial rule of Genz and Monahan (1998), of which the sparse grid is the
      ``rho = sqrt(3)`` member. Every copy stays exact for degree <= 3, and the estimate becomes unbiased for
      every integrand, so its error falls as ``s`` grows, as a Monte Carlo estimate's does (finite variance
      for ``d >= 3``). With ``radius="fixed"`` the sparse-grid nodes are kept: the estimate is then biased by
      the rule's degree-5 error, which no number of copies removes.

    ``create("sgq", 2 * d + 1, d, rotate=False, radius="fixed")`` is exactly the paper's ``W_SGQ``.

    Args:
        degree: total polynomial degree the rule integrates exactly (odd; 3 as in the paper, and the only
            one ``radius="random"`` takes).
        rotate: rotate each copy by an independent Haar rotation.
        radius: ``"random"`` or ``"fixed"``, as above.
    """

    def __init__(
        self,
        num_features: int,
        dim: int,
        *,
        degree: int = 3,
        rotate: bool = True,
        radius: str = "random",
        **kw,
    ) -> None:
        check_positive_int("num_features", num_features)
        points, weights = smolyak_gauss_hermite(check_positive_int("dim", dim), degree)
        if radius not in ("random", "fixed"):
            raise ValueError(f"radius: expected 'random' or 'fixed', got {radius!r}")
        if radius == "random" and degree != 3:
            raise ValueError(f"degree: radius='random' needs degree=3, got degree={degree}")
        away = points.abs().sum(dim=-1) > 0
        self._nodes, self._node_weights = points[away], weights[away]
        copies = max(1, round((num_features - 1) / len(self._nodes)))
        if copies > 1 and not rotate and radius == "fixed":
            raise ValueError(
                f"num_features: {num_features} needs {copies} copies of the {len(points)}-point rule, "
                "which would all be equal without rotate=True or radius='random'"
            )
        self.requested_features, self.degree, self.rotate, self.radius, self.copies = (
            num_features,
            degree,
            rotate,
            radius,
            copies,
        )
        super().__init__(1 + copies * len(self._nodes), dim, **kw)

    def _copies(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Nodes ``(c, n, d)`` and their weights ``(c, n)`` of the rotated and stretched copies."""
        g = self.generator
        nodes = self._nodes.to(g.device).expand(self.copies, -1, -1)
        weights = self._node_weights.to(g.device).expand(self.copies, -1)
        if self.rotate:
            nodes = nodes @ haar_orthogonal(self.copies, self.dim, g).mT
        if self.radius == "random":
            rho2 = chi_samples(self.copies, self.dim + 2, g).pow(2).unsqueeze(-1)  # (c, 1)
            nodes = nodes * (rho2 / 3).sqrt().unsqueeze(-1)
            weights = weights * (3 / rho2)
        return nodes, weights / self.copies

    def sample(self) -> torch.Tensor:
        """``(s, d)`` nodes: the origin, then the nodes of each copy."""
        return self._sample_with_weights()[0]

    def _sample_with_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        nodes, weights = self._copies()
        weights = weights.reshape(-1)
        origin = torch.zeros(1, self.dim, dtype=torch.float64, device=nodes.device)
        return (
            torch.cat((origin, nodes.reshape(-1, self.dim))),
            torch.cat(((1 - weights.sum()).reshape(1), weights)),
        )

    def _resample(self) -> None:
        nodes, weights = self._sample_with_weights()
        self._set_state(weight=nodes / self.sigma, quadrature_weights=weights)

    @property
    def component_weights(self) -> torch.Tensor:
        """Quadrature weights ``(s,)`` summing to 1; the origin's is negative for ``d > 3``."""
        return self.quadrature_weights

    def extra_repr(self) -> str:
        """The sizes and options shown by ``repr``."""
        return (
            f"{super().extra_repr()}, degree={self.degree}, copies={self.copies}, "
            f"rotate={self.rotate}, radius={self.radius!r}"
        )
