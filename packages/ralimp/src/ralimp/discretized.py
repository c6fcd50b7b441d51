r"""The function a RaLiMP layer computes in expectation, and its fit in that basis (Secs. 2.3-2.4, App. C.2).

With the per-node coefficients free, the expected output of a RaLiMP over its random projections is

$$\mathbb E\, y(t) = \sum_{n \le K} c_n t^n + \sum_j \sum_{k \le n_\mathrm{freq}}
\left[w^c_{jk} \cos(s_k t / q_j) + w^s_{jk} \sin(s_k t / q_j)\right]$$

($s_k$ the Gauss-Laguerre nodes). Discretizing a continuous rational fit node by node ($w = \gamma_k$
times the atom's coefficients) misses $f$ by far more than the fit does (GELU $J = 1$: 2.4e-3 -> 0.32
on $[-4, 4]$), so `fit_discretized` fits $f$ directly in this basis: $c$, $w^c$, $w^s$ by
linear least squares for given widths $q$, and the $q$ by Levenberg-Marquardt on top (variable
projection). The centers $p$ do not enter $\mathbb E\, y$ once the node coefficients are free (the phase
$s_k p / q$ is a rotation of $(w^c_{jk}, w^s_{jk})$); they are kept from the continuous fit, and $A, B$
and the node weights $\rho$ are the parametrization of the layer:

$$w^c = \rho^c c_A \cos\phi - \rho^s c_B \sin\phi, \qquad w^s = \rho^c c_A \sin\phi + \rho^s c_B \cos\phi,$$

$c_A = A / q^2$, $c_B = B / q$, $\phi_k = s_k p / q$, normalized so that $\sum_k \rho_k = 1$ (as the
Gauss-Laguerre weights, which they replace).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ralimp.activations import ACTIVATIONS
from ralimp.quadrature import gauss_laguerre
from ralimp.rational import (
    DEFAULT_INTERVAL,
    AtomFit,
    RationalFunction,
    activation_fit,
    fit_rational,
    levenberg_marquardt,
    shipped_fit_key,
    shipped_fits,
)
from ralimp.ridge import scaled_ridge_solve
from spectraformer_core import check_positive_int


def channel_coefficients(
    atoms: torch.Tensor, rho_c: torch.Tensor, rho_s: torch.Tensor, nodes: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""$(w^c, w^s)$, each ``(J, n)``: the coefficients of $\cos(s_k t / q_j)$ and $\sin(s_k t / q_j)$.

    Args:
        atoms: ``(J, 4)`` rows ``(A, B, p, q)``.
        rho_c: ``(J, n)`` node weights of the even part.
        rho_s: ``(J, n)`` node weights of the odd part.
        nodes: ``(n,)`` Gauss-Laguerre nodes $s_k$.
    """
    a, b, p, q = (atoms[:, i].unsqueeze(-1) for i in range(4))
    c_a = a / q**2 * rho_c
    c_b = b / q * rho_s
    phase = nodes * p / q
    return c_a * phase.cos() - c_b * phase.sin(), c_a * phase.sin() + c_b * phase.cos()


def expected_value(
    t: torch.Tensor,
    poly: torch.Tensor,
    w_c: torch.Tensor,
    w_s: torch.Tensor,
    nodes: torch.Tensor,
    widths: torch.Tensor,
) -> torch.Tensor:
    r"""$\sum_n c_n t^n + \sum_{jk} [w^c_{jk} \cos(s_k t / q_j) + w^s_{jk} \sin(s_k t / q_j)]$ elementwise.

    Args:
        t: ``(...)`` pre-activations.
        poly: ``(K + 1,)`` coefficients $c_n$.
        w_c: ``(J, n)``.
        w_s: ``(J, n)``.
        nodes: ``(n,)``.
        widths: ``(J,)`` the $q_j$.
    """
    out = torch.zeros_like(t)
    for c in poly.flip(0):  # Horner
        out = out * t + c
    if w_c.numel():
        arg = t.unsqueeze(-1).unsqueeze(-1) * (nodes / widths.unsqueeze(-1))
        out = out + (w_c * arg.cos() + w_s * arg.sin()).sum((-1, -2))
    return out


class DiscretizedFit(AtomFit):
    r"""The expected output of a RaLiMP as a function of $t$: a fit in the basis the layer computes.

    Args:
        poly: ``c_0..c_K``.
        atoms: ``(A, B, p, q)`` per atom.
        node_cos: ``(J, n)`` node weights $\rho^c$ ($\sum_k = 1$ per atom unless the even part is 0).
        node_sin: ``(J, n)`` node weights $\rho^s$.
        interval: the interval of the fit.
        max_error: largest absolute error of $\mathbb E\, y$ on ``interval`` (4001-point grid).
        rms_error: RMS error of $\mathbb E\, y$ on ``interval``.
        continuous: the continuous rational fit the centers $p$ came from (its own errors), or None.
    """

    def __init__(
        self,
        poly: list[float] | torch.Tensor,
        atoms: list[tuple[float, float, float, float]] | torch.Tensor,
        node_cos: list[list[float]] | torch.Tensor,
        node_sin: list[list[float]] | torch.Tensor,
        interval: tuple[float, float] = DEFAULT_INTERVAL,
        max_error: float | None = None,
        rms_error: float | None = None,
        continuous: RationalFunction | None = None,
    ) -> None:
        super().__init__(poly, atoms, interval, max_error, rms_error)
        num_atoms = self._atoms.shape[0]
        per_atom = (num_atoms, -1 if num_atoms else 0)  # no atoms: (0, 0), not an ambiguous (0, -1)
        self._rho_c = torch.as_tensor(node_cos, dtype=torch.float64).reshape(per_atom).clone()
        self._rho_s = torch.as_tensor(node_sin, dtype=torch.float64).reshape(per_atom).clone()
        if self._rho_s.shape != self._rho_c.shape:
            raise ValueError(
                f"node_sin: expected shape {tuple(self._rho_c.shape)} (as node_cos), "
                f"got {tuple(self._rho_s.shape)}"
            )
        self.continuous = continuous

    node_cos = property(lambda self: self._rho_c.clone(), doc="``(J, n)`` node weights of the even parts.")
    node_sin = property(lambda self: self._rho_s.clone(), doc="``(J, n)`` node weights of the odd parts.")

    @property
    def num_freqs(self) -> int:
        """``n_freq``, the Gauss-Laguerre nodes per atom (0 without atoms)."""
        return self._rho_c.shape[1] if self.num_atoms else 0

    def coefficients(self) -> tuple[torch.Tensor, torch.Tensor]:
        """$(w^c, w^s)$, ``(J, n)`` each (`channel_coefficients`)."""
        nodes = gauss_laguerre(self.num_freqs)[0] if self.num_atoms else torch.zeros(0, dtype=torch.float64)
        return channel_coefficients(self._atoms, self._rho_c, self._rho_s, nodes)

    def evaluate(self, x: torch.Tensor) -> torch.Tensor:
        r"""$\mathbb E\, y(x)$ in ``x``'s dtype (`expected_value`)."""
        w_c, w_s = (w.to(x) for w in self.coefficients())
        nodes = gauss_laguerre(max(self.num_freqs, 1))[0][: self.num_freqs].to(x)
        return expected_value(x, self._poly.to(x), w_c, w_s, nodes, self._atoms[:, 3].to(x))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (inverse of `from_dict`)."""
        return {
            "poly": self.poly,
            "atoms": [list(a) for a in self.atoms],
            "node_cos": self._rho_c.tolist(),
            "node_sin": self._rho_s.tolist(),
            "interval": list(self.interval),
            "max_error": self.max_error,
            "rms_error": self.rms_error,
            "continuous": None if self.continuous is None else self.continuous.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DiscretizedFit:
        """Rebuild from `to_dict` output."""
        continuous = data.get("continuous")
        return cls(
            data["poly"],
            data["atoms"],
            data["node_cos"],
            data["node_sin"],
            tuple(data["interval"]),
            data.get("max_error"),
            data.get("rms_error"),
            None if continuous is None else RationalFunction.from_dict(continuous),
        )

    def __repr__(self) -> str:
        err = "" if self.max_error is None else f", max_error={self.max_error:.2e}"
        return (
            f"DiscretizedFit(K={self.poly_degree}, J={self.num_atoms}, num_freqs={self.num_freqs}, "
            f"interval={self.interval}{err})"
        )


def nodewise_quadrature(fit: RationalFunction, num_freqs: int) -> DiscretizedFit:
    r"""The continuous ``fit`` discretized node by node (weights $\gamma_k$): the layer before this fit.

    Its error against the activation is what a layer initialized at the Gauss-Laguerre weights computes in
    expectation; kept for the comparison in the shipped table.
    """
    _, gammas = gauss_laguerre(num_freqs)
    rho = gammas.expand(fit.num_atoms, num_freqs)
    return DiscretizedFit(fit.poly, fit.atoms, rho, rho, fit.interval, continuous=fit)


def node_basis(t: torch.Tensor, widths: torch.Tensor, nodes: torch.Tensor, poly_degree: int) -> torch.Tensor:
    r"""Columns $t^0..t^K$, then $\cos(s_k t / q_j)$ for every $(j, k)$, then the $\sin$ of the same.

    ``t`` ``(N,)``, ``widths`` ``(..., J)``, ``nodes`` ``(n,)``: ``(..., N, K + 1 + 2 J n)``, one basis per
    leading index of ``widths`` (`with_nodes` of the `poly_columns`).
    """
    return with_nodes(poly_columns(t, poly_degree), t, widths, nodes)


def poly_columns(t: torch.Tensor, poly_degree: int) -> torch.Tensor:
    """The columns $t^0..t^K$ of `node_basis`, ``(N, K + 1)``."""
    return t.unsqueeze(-1) ** torch.arange(poly_degree + 1, dtype=t.dtype)


def with_nodes(
    poly: torch.Tensor, t: torch.Tensor, widths: torch.Tensor, nodes: torch.Tensor
) -> torch.Tensor:
    r"""`node_basis` from its polynomial columns ``poly`` ``(N, K + 1)``: they, the cos, then the sin."""
    if not widths.numel():
        return poly.expand(*widths.shape[:-1], *poly.shape)
    freqs = (nodes / widths.unsqueeze(-1)).flatten(-2).unsqueeze(-2)  # (..., 1, J n)
    arg = t.unsqueeze(-1) * freqs
    return torch.cat([poly.expand(*arg.shape[:-1], -1), arg.cos(), arg.sin()], -1)


def gauge(
    w_c: torch.Tensor, w_s: torch.Tensor, centers: torch.Tensor, widths: torch.Tensor, nodes: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(atoms (J, 4), rho_c, rho_s)`` giving ``(w^c, w^s)`` with the given centers, ``sum_k rho = 1``."""
    phase = nodes * centers.unsqueeze(-1) / widths.unsqueeze(-1)
    even = w_c * phase.cos() + w_s * phase.sin()  # rho^c c_A
    odd = -w_c * phase.sin() + w_s * phase.cos()  # rho^s c_B
    _, gammas = gauss_laguerre(nodes.numel())

    def split(part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        total, size = part.sum(-1), part.abs().sum(-1)
        # a part whose node weights nearly cancel keeps a positive total of their sizes instead
        strength = torch.where(total.abs() >= 1e-3 * size, total, size)
        safe = torch.where(strength == 0, torch.ones_like(strength), strength)
        rho = torch.where((strength == 0).unsqueeze(-1), gammas.expand_as(part), part / safe.unsqueeze(-1))
        return strength, rho

    c_a, rho_c = split(even)
    c_b, rho_s = split(odd)
    atoms = torch.stack([c_a * widths**2, c_b * widths, centers, widths], -1)
    return atoms, rho_c, rho_s


def fit_discretized(
    fn: Callable[[torch.Tensor], torch.Tensor] | str,
    interval: tuple[float, float] = DEFAULT_INTERVAL,
    *,
    poly_degree: int,
    num_atoms: int,
    num_freqs: int,
    continuous: RationalFunction | None = None,
    q_floor: float = 0.05,
    num_points: int = 2001,
    num_starts: int = 4,
    max_iter: int = 100,
    coef_penalty: float = 1e-8,
    seed: int = 0,
) -> DiscretizedFit:
    r"""Fit $f$ on ``interval`` in the basis a RaLiMP computes with ``num_freqs`` Gauss-Laguerre nodes.

    $$\min\ \operatorname{mean}_t \Big(P(t) + \sum_{jk} \big[w^c_{jk} \cos(s_k t / q_j)
    + w^s_{jk} \sin(s_k t / q_j)\big] - f(t)\Big)^2 + \mu \sum_{jk} \big((w^c_{jk})^2 + (w^s_{jk})^2\big)$$

    ($\mu$ = ``coef_penalty``) on a uniform float64 grid, jointly over the polynomial, all
    node coefficients and the widths $q_j = q_\mathrm{floor} + \operatorname{softplus}(\rho_j)$. The penalty
    keeps the node coefficients from cancelling each other and the polynomial (unpenalized, near-collinear
    columns reach $|w| \sim 500$ for GELU at 3 nodes); $(w^c)^2 + (w^s)^2$ is the factor of each node's
    variance (App. A.3), so it trades a little bias for orders of magnitude of variance. For fixed widths the
    coefficients are a linear least-squares solution, and Levenberg-Marquardt moves the widths (variable
    projection), from ``num_starts`` starts: the continuous fit's widths, then random ones. The centers $p$
    come from the continuous fit (they do not change $\mathbb E\, y$, see the module docstring).

    Args:
        fn: an elementwise function of a float64 tensor, a registered activation name, or a
            `RationalFunction` (then also the default ``continuous``).
        interval: ``(a, b)``.
        poly_degree: $K \ge 0$.
        num_atoms: $J \ge 0$.
        num_freqs: Gauss-Laguerre nodes per atom.
        continuous: the continuous rational fit (``fit_rational``) giving the start widths and the
            centers; fitted now when None.
        q_floor: smallest width.
        num_points: grid size.
        num_starts: Levenberg-Marquardt starts.
        max_iter: iterations per start.
        coef_penalty: weight $\mu \ge 0$ of $\sum ((w^c)^2 + (w^s)^2)$ against the mean squared error.
        seed: seed of the random starts.

    Returns:
        the `DiscretizedFit`, with its errors and the continuous fit.
    """
    if isinstance(fn, RationalFunction) and continuous is None:
        continuous = fn
    fn = ACTIVATIONS.get(fn) if isinstance(fn, str) else fn
    num_freqs = check_positive_int("num_freqs", num_freqs)
    a, b = (float(v) for v in interval)
    if continuous is None:
        continuous = fit_rational(
            fn, (a, b), num_atoms=num_atoms, poly_degree=poly_degree, num_points=num_points, seed=seed
        )
    elif (continuous.poly_degree, continuous.num_atoms) != (poly_degree, num_atoms):
        raise ValueError(
            f"continuous: expected a fit with K={poly_degree}, J={num_atoms}, got {continuous!r}"
        )
    t = torch.linspace(a, b, check_positive_int("num_points", num_points), dtype=torch.float64)
    f = fn(t).to(torch.float64)
    nodes, _ = gauss_laguerre(num_freqs)
    centers = continuous.atom_table[:, 2]

    def widths(theta: torch.Tensor) -> torch.Tensor:
        return F.softplus(theta) + q_floor

    if not coef_penalty >= 0:
        raise ValueError(f"coef_penalty: expected a number >= 0, got {coef_penalty!r}")
    penalty = torch.zeros(poly_degree + 1 + 2 * num_atoms * num_freqs, dtype=torch.float64)
    penalty[poly_degree + 1 :] = coef_penalty

    def residual(theta: torch.Tensor) -> torch.Tensor:
        basis = node_basis(t, widths(theta), nodes, poly_degree)
        coef = scaled_ridge_solve(basis, f, diagonal=penalty, jitter=1e-14)
        error = (basis @ coef - f) / math.sqrt(t.numel())
        return torch.cat([error, (penalty.sqrt() * coef)[poly_degree + 1 :]])

    gen = torch.Generator().manual_seed(seed)
    half = (b - a) / 2
    start_q = continuous.atom_table[:, 3].clamp_min(q_floor * 1.01)
    best: torch.Tensor | None = None
    best_cost = math.inf
    for start in range(num_starts if num_atoms else 1):
        q0 = (
            start_q
            if start == 0
            else half * (0.1 + 1.9 * torch.rand(num_atoms, generator=gen, dtype=torch.float64))
        )
        theta = levenberg_marquardt(
            residual, torch.log(torch.expm1((q0 - q_floor).clamp_min(1e-6))), max_iter
        )
        cost = float(residual(theta).pow(2).sum())
        if math.isfinite(cost) and cost < best_cost:
            best, best_cost = theta, cost
    assert best is not None, "no start reached a finite cost"
    q = widths(best)
    coef = scaled_ridge_solve(node_basis(t, q, nodes, poly_degree), f, diagonal=penalty, jitter=1e-14)
    poly, trig = coef[: poly_degree + 1], coef[poly_degree + 1 :]
    w_c = trig[: num_atoms * num_freqs].reshape(num_atoms, num_freqs)
    w_s = trig[num_atoms * num_freqs :].reshape(num_atoms, num_freqs)
    atoms, rho_c, rho_s = gauge(w_c, w_s, centers, q, nodes)
    fit = DiscretizedFit(poly, atoms, rho_c, rho_s, (a, b), continuous=continuous)
    fit.max_error, fit.rms_error = fit.errors(fn)
    return fit


def layer_fit(
    activation: str,
    *,
    poly_degree: int = 2,
    num_atoms: int = 1,
    num_freqs: int = 3,
    interval: tuple[float, float] = DEFAULT_INTERVAL,
) -> DiscretizedFit:
    """The discretized fit of a registered activation: the shipped one when it exists, else fitted now.

    Fits of the shipped activations on ``[-4, 4]`` for ``K = 1..3``, ``J = 0..3`` and ``num_freqs = 1..4``
    ship in ``ralimp/fits.json`` (``ralimp-fit`` recomputes them); others take a few seconds.
    """
    fn = ACTIVATIONS.get(activation)
    key = f"{shipped_fit_key(activation, poly_degree, num_atoms)}/N{num_freqs}"
    data = shipped_fits().get("discretized", {}).get(key)
    continuous = activation_fit(activation, poly_degree=poly_degree, num_atoms=num_atoms, interval=interval)
    if data is not None and tuple(data["interval"]) == tuple(float(v) for v in interval):
        fit = DiscretizedFit.from_dict(data)
        fit.continuous = continuous
        return fit
    return fit_discretized(
        fn, interval, poly_degree=poly_degree, num_atoms=num_atoms, num_freqs=num_freqs, continuous=continuous
    )
