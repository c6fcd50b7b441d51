"""Gauss-Laguerre quadrature for the Laplace representation of the rational atoms."""

from __future__ import annotations

import functools

import torch

from spectraformer_core import check_positive_int


@functools.cache
def _gauss_laguerre(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.arange(n, dtype=torch.float64)
    jacobi = torch.diag(2 * k + 1) + torch.diag(k[1:], 1) + torch.diag(k[1:], -1)
    nodes, vectors = torch.linalg.eigh(jacobi)
    weights = vectors[0] ** 2
    return nodes, weights / weights.sum()


def gauss_laguerre(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The $n$-point Gauss-Laguerre rule for the weight $e^{-s}$ on $[0, \infty)$, float64.

    Golub-Welsch: the nodes $s_k$ are the eigenvalues of the Jacobi matrix of the Laguerre polynomials
    (diagonal $2k + 1$, off-diagonal $k$), the weights $\gamma_k$ the squared first components of its
    unit eigenvectors (times $\int e^{-s}\, ds = 1$, so they sum to 1). The rule integrates
    $e^{-s} s^j$ exactly ($= j!$) for $j \le 2n - 1$.

    Returns:
        ``(nodes (n,), weights (n,))``, nodes increasing, weights positive.
    """
    nodes, weights = _gauss_laguerre(check_positive_int("n", n))
    return nodes.clone(), weights.clone()


def atom_quadrature_error(num_freqs: int, u_max: float, *, points: int = 2001) -> float:
    r"""Largest error of the ``num_freqs``-node rule on the centered atom, over $|u| \le u_\mathrm{max}$.

    $\max |\sum_k \gamma_k \cos(s_k u) - 1/(1+u^2)|$ and the same for $\sin$ against $u/(1+u^2)$
    (the Laplace integrals of Sec. 2.3), over $u \in [0, u_\mathrm{max}]$ (both parts are even/odd in $u$).
    """
    s, g = gauss_laguerre(num_freqs)
    u = torch.linspace(0.0, float(u_max), points, dtype=torch.float64).unsqueeze(-1)
    cos_err = (g * torch.cos(s * u)).sum(-1) - 1 / (1 + u.squeeze(-1) ** 2)
    sin_err = (g * torch.sin(s * u)).sum(-1) - u.squeeze(-1) / (1 + u.squeeze(-1) ** 2)
    return float(torch.maximum(cos_err.abs(), sin_err.abs()).max())


def resolvable_argument(num_freqs: int, tol: float) -> float:
    r"""The largest ``U`` such that the ``num_freqs``-node rule is within ``tol`` of the atom on $|u| \le U$.

    Found by bisection on [`atom_quadrature_error`][ralimp.atom_quadrature_error]; an atom of width ``q``
    centered at ``p`` is resolved on an interval ``[a, b]`` when $\max(|a - p|, |b - p|) / q \le U$.
    """
    if not 0 < tol < 1:
        raise ValueError(f"tol: expected a tolerance in (0, 1), got {tol!r}")
    lo, hi = 0.0, 1.0
    while atom_quadrature_error(num_freqs, hi) <= tol and hi < 1e4:
        lo, hi = hi, 2 * hi
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if atom_quadrature_error(num_freqs, mid) <= tol else (lo, mid)
    return lo
