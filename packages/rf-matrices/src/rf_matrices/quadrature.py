"""Quadrature weight matrices: degree-3 cubature rules for ``N(0, I)``, SGQ (Section 3.1.7)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

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


def _compositions(total: int, dim: int) -> Iterator[tuple[list[int], list[int]]]:
    """Multi-indices ``k >= 0`` of ``dim`` entries summing to ``total``, as (support, nonzero values)."""
    if total == 0:
        yield [], []
        return
    for size in range(1, min(total, dim) + 1):
        for support in itertools.combinations(range(dim), size):
            for parts in _positive_parts(total, size):
                yield list(support), list(parts)


def _positive_parts(total: int, size: int) -> Iterator[tuple[int, ...]]:
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


#: The cubature rules `SGQ` builds; the first is the default.
RULES = ("stiefel", "spherical-radial", "smolyak")


def haar_stiefel(rows: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    """A Haar-distributed ``(rows, dim)`` matrix with orthonormal columns (``rows >= dim``), float64.

    The Q factor of the reduced QR of a Gaussian matrix, the signs of R's diagonal moved into Q (Mezzadri
    2007): the first ``dim`` columns of a Haar orthogonal ``rows x rows`` matrix.
    """
    g = torch.randn(rows, dim, generator=generator, dtype=torch.float64, device=generator.device)
    q, r = torch.linalg.qr(g)
    return q * torch.sign(torch.diagonal(r)).unsqueeze(-2)


@register("sgq")
class SGQ(DenseWeightMatrix):
    """Rows that are the nodes of a degree-3 cubature rule for ``N(0, I / sigma^2)`` (Section 3.1.7).

    Every rule has exactly ``num_features`` nodes and integrates every polynomial of total degree <= 3
    exactly (the folded ``stiefel`` rule: every even one); a count a rule cannot have is refused with the
    nearest counts it can. Three rules:

    - ``rule="stiefel"`` (the default): equal weights ``1/s`` (so
      [`component_weights`][rf_matrices.SGQ.component_weights] is None and every kernel estimate of a positive
      component function stays positive). With ``antipodal=True`` the nodes are ``sqrt(s/2) [0; U; -U]`` (the
      origin only for odd ``s``), ``U`` a Haar-random ``(s // 2, d)`` matrix with orthonormal columns: odd
      moments vanish by symmetry and ``W.T @ W / s = I`` exactly, so the rule is exact for degree 3; for
      ``s = 2d`` it is the 2d-point rule ``+-sqrt(d) e_i``, randomly rotated (Stroud 1971). ``s >= 2d``. With
      ``antipodal=False`` (the default) the nodes are ``sqrt(s) U``, ``U`` of shape ``(s, d)``: the same rule
      folded, one node per antipodal pair, which gives the same estimate for integrands even in omega
      (TrigRF's ``cos(omega.(x - y))``, PosRF-Hyp's ``cosh``) at half the rows, and is exact for every even
      polynomial of degree <= 3. ``s >= d``. ``rf_features`` picks ``antipodal`` from the component function.
      The nodes are not exactly Gaussian (rows of an orthonormal frame, scaled), so estimates carry a bias
      that shrinks as ``s`` grows.
    - ``rule="spherical-radial"``: ``c`` copies of the stochastic spherical-radial rule (Genz and Monahan
      1998) sharing the origin: each copy ``+-rho R e_i`` with a Haar rotation ``R``, ``rho ~ chi(d + 2)``,
      weights ``1 / (2 c rho^2)``, and the origin ``1 - sum``, which is negative whenever the copies'
      ``rho^2 < d`` on average. Unbiased for every integrand. ``s = 1 + 2dc``.
    - ``rule="smolyak"``: ``c`` copies of the Smolyak sparse grid of
      [`smolyak_gauss_hermite`][rf_matrices.smolyak_gauss_hermite] sharing its origin, each rotated by a Haar
      rotation (``rotate=True``). At degree 3 the grid is ``0, +-sqrt(3) e_i`` with weights ``1 - d/3``
      (negative for ``d > 3``) and ``1/6``: ``create("sgq", 2 * d + 1, d, rule="smolyak", rotate=False)`` is
      exactly the paper's ``W_SGQ``. ``s = 1 + c * (nodes of the grid - 1)``.

    `signed_weights` is True for the last two at ``d > 3`` (for ``spherical-radial``, always):
    their quadrature weights can be negative, and so can the kernel estimates built from them.

    Args:
        rule: one of `RULES`.
        antipodal: ``rule="stiefel"`` only: keep both nodes of each antipodal pair.
        degree: ``rule="smolyak"`` only: the odd total degree the grid integrates exactly.
        rotate: ``rule="smolyak"`` only: rotate each copy by an independent Haar rotation.
    """

    @classmethod
    def symmetry_options(cls, even_in_omega: bool, options: dict[str, Any]) -> dict[str, Any]:
        """The folded ``stiefel`` rule only for even integrands: ``antipodal = not even_in_omega``.

        An explicit ``antipodal`` in ``options`` is kept; the other rules are symmetric already.
        """
        if options.get("rule", "stiefel") != "stiefel":
            return options
        return {"antipodal": not even_in_omega, **options}

    def __init__(
        self,
        num_features: int,
        dim: int,
        *,
        rule: str = "stiefel",
        antipodal: bool = False,
        degree: int = 3,
        rotate: bool = True,
        **kw: Any,
    ) -> None:
        check_positive_int("num_features", num_features)
        check_positive_int("dim", dim)
        if rule not in RULES:
            raise ValueError(f"rule: expected one of {RULES}, got {rule!r}")
        if degree != 3 and rule != "smolyak":
            raise ValueError(
                f"degree: rule={rule!r} is a degree-3 rule, got degree={degree}; use rule='smolyak'"
            )
        if antipodal and rule != "stiefel":
            raise ValueError(f"antipodal: only rule='stiefel' has this option (rule={rule!r} is symmetric)")
        if not rotate and rule != "smolyak":
            raise ValueError(
                f"rotate: rule={rule!r} is random by construction; rotate=False needs rule='smolyak'"
            )
        self.rule, self.antipodal, self.degree, self.rotate = rule, antipodal, degree, rotate
        if rule == "stiefel":
            self.copies, self.signed_weights = 0, False
            label = f"rule='stiefel', antipodal={antipodal}"
            _check_count(num_features, dim, label, 2 * dim if antipodal else dim, None)
        else:
            points, weights = smolyak_gauss_hermite(dim, 3 if rule == "spherical-radial" else degree)
            away = points.abs().sum(dim=-1) > 0
            self._nodes, self._node_weights = points[away], weights[away]
            label = f"rule={rule!r}" + (f", degree={degree}" if rule == "smolyak" else "")
            self.copies = _check_count(num_features, dim, label, 1 + len(self._nodes), len(self._nodes))
            if self.copies > 1 and not rotate:
                raise ValueError(
                    f"rotate: num_features={num_features} needs {self.copies} copies of the rule, which "
                    "would all be equal with rotate=False"
                )
            self.signed_weights = rule == "spherical-radial" or bool((weights < 0).any())
        super().__init__(num_features, dim, **kw)

    def sample(self) -> torch.Tensor:
        """``(s, d)`` unit-bandwidth nodes."""
        return self._sample_with_weights()[0]

    def _sample_with_weights(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Nodes ``(s, d)`` and their weights ``(s,)`` (None for the equal-weight ``stiefel`` rule)."""
        g, s = self.generator, self.num_features
        if self.rule == "stiefel":
            if not self.antipodal:
                return haar_stiefel(s, self.dim, g) * math.sqrt(s), None
            frame = haar_stiefel(s // 2, self.dim, g) * math.sqrt(s / 2)
            origin = torch.zeros(s % 2, self.dim, dtype=torch.float64, device=g.device)
            return torch.cat((origin, frame, -frame)), None
        nodes = self._nodes.to(g.device).expand(self.copies, -1, -1)  # (c, n, d)
        weights = self._node_weights.to(g.device).expand(self.copies, -1)  # (c, n)
        if self.rotate:
            nodes = nodes @ haar_orthogonal(self.copies, self.dim, g).mT
        if self.rule == "spherical-radial":  # radius sqrt(3) -> rho, weight 1/6 -> 1 / (2 rho^2)
            rho2 = chi_samples(self.copies, self.dim + 2, g).pow(2).unsqueeze(-1)  # (c, 1)
            nodes = nodes * (rho2 / 3).sqrt().unsqueeze(-1)
            weights = weights * (3 / rho2)
        weights = (weights / self.copies).reshape(-1)
        origin = torch.zeros(1, self.dim, dtype=torch.float64, device=g.device)
        return (
            torch.cat((origin, nodes.reshape(-1, self.dim))),
            torch.cat(((1 - weights.sum()).reshape(1), weights)),
        )

    quadrature_weights: torch.Tensor  # (s,), absent for "stiefel"

    def _resample(self) -> None:
        nodes, weights = self._sample_with_weights()
        if weights is None:
            self._set_state(weight=nodes / self.sigma)
        else:
            self._set_state(weight=nodes / self.sigma, quadrature_weights=weights)

    @property
    def component_weights(self) -> torch.Tensor | None:
        """None for ``stiefel`` (every node weighs ``1/s``), else the weights ``(s,)``, summing to 1."""
        return None if self.rule == "stiefel" else self.quadrature_weights

    def extra_repr(self) -> str:
        """The sizes and options shown by ``repr``."""
        options = {"stiefel": f"antipodal={self.antipodal}", "spherical-radial": f"copies={self.copies}"}
        detail = options.get(self.rule, f"degree={self.degree}, copies={self.copies}, rotate={self.rotate}")
        return f"{super().extra_repr()}, rule={self.rule!r}, {detail}"


def _check_count(num_features: int, dim: int, label: str, smallest: int, step: int | None) -> int:
    """The number of copies ``c`` with ``num_features = 1 + c * step`` (``step`` None: any count >= smallest).

    Raises a ``ValueError`` with the nearest valid counts when the rule cannot have ``num_features`` nodes.
    """
    if step is None and num_features >= smallest:
        return 0
    if step is not None and num_features >= smallest and (num_features - 1) % step == 0:
        return (num_features - 1) // step
    if step is None or num_features < smallest:
        valid = [smallest]
    else:
        below = 1 + (num_features - 1) // step * step
        valid = [below, below + step]
    form = f"at least {smallest} rows" if step is None else f"1 + c * {step} rows (c >= 1 copies)"
    raise ValueError(
        f"num_features: sgq with {label} and dim={dim} has {form}, got {num_features}; "
        f"nearest valid count{'s' if len(valid) > 1 else ''}: {', '.join(map(str, valid))}"
    )
