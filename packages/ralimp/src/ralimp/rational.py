r"""Rational surrogates of activations in partial-fraction form, and their least-squares fit (Sec. 2.1).

$$R(t) = \sum_{n=0}^K c_n t^n + \sum_j \frac{A_j + B_j (t - p_j)}{(t - p_j)^2 + q_j^2}$$

with $q_j > 0$: every denominator is an irreducible quadratic with the complex poles $p_j \pm i q_j$, so $R$
is finite on the real line by construction.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from importlib import resources
from typing import Any

import torch
import torch.nn.functional as F

from ralimp.activations import ACTIVATIONS
from spectraformer_core import check_int, check_positive_int

#: The interval the shipped fits cover.
DEFAULT_INTERVAL = (-4.0, 4.0)


class AtomFit:
    r"""What every fit of an activation shares: polynomial ``c_0..c_K``, atoms ``(A, B, p, q)``, interval.

    Subclasses give `evaluate` (on a tensor already in its work dtype); calling the fit evaluates it
    elementwise in ``t``'s dtype (in at least float32). The arguments are `RationalFunction`'s.
    """

    def __init__(
        self,
        poly: list[float] | torch.Tensor,
        atoms: list[tuple[float, float, float, float]] | torch.Tensor,
        interval: tuple[float, float] = DEFAULT_INTERVAL,
        max_error: float | None = None,
        rms_error: float | None = None,
    ) -> None:
        self._poly = torch.as_tensor(poly, dtype=torch.float64).reshape(-1).clone()
        self._atoms = torch.as_tensor(atoms, dtype=torch.float64).reshape(-1, 4).clone()
        if self._poly.numel() == 0:
            raise ValueError("poly: expected at least the constant coefficient c_0, got none")
        if (self._atoms[:, 3] <= 0).any():
            raise ValueError(f"atoms: expected every width q > 0, got q = {self._atoms[:, 3].tolist()}")
        self.interval = (float(interval[0]), float(interval[1]))
        self.max_error, self.rms_error = max_error, rms_error

    @property
    def poly(self) -> list[float]:
        """Polynomial coefficients ``c_0..c_K``."""
        return self._poly.tolist()

    @property
    def atoms(self) -> list[tuple[float, float, float, float]]:
        """The atoms as ``(A, B, p, q)`` tuples."""
        return [tuple(row) for row in self._atoms.tolist()]

    @property
    def atom_table(self) -> torch.Tensor:
        """The atoms as a float64 ``(J, 4)`` tensor of rows ``(A, B, p, q)`` (a copy)."""
        return self._atoms.clone()

    @property
    def poly_degree(self) -> int:
        """``K``."""
        return self._poly.numel() - 1

    @property
    def num_atoms(self) -> int:
        """``J``."""
        return self._atoms.shape[0]

    def evaluate(self, x: torch.Tensor) -> torch.Tensor:
        """The fit at ``x``, a floating tensor in the dtype to compute in."""
        raise NotImplementedError

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        """The fit elementwise, in ``t``'s dtype (evaluated in at least float32)."""
        t = torch.as_tensor(t)
        work = torch.promote_types(t.dtype, torch.float32) if t.is_floating_point() else torch.float64
        out = self.evaluate(t.to(work))
        return out.to(t.dtype) if t.is_floating_point() else out

    def errors(self, fn: Callable[[torch.Tensor], torch.Tensor], points: int = 4001) -> tuple[float, float]:
        """``(max, rms)`` absolute error against ``fn`` on a uniform float64 grid of ``interval``."""
        return grid_errors(self, fn, self.interval, points)


class RationalFunction(AtomFit):
    r"""$R(t) = P(t) + \sum_j (A_j + B_j (t - p_j)) / ((t - p_j)^2 + q_j^2)$, callable on tensors.

    Args:
        poly: polynomial coefficients ``c_0..c_K`` (lowest degree first).
        atoms: ``(A, B, p, q)`` per atom, ``q > 0``.
        interval: the interval the function was fitted on.
        max_error: largest absolute error of the fit on ``interval`` (None if unknown).
        rms_error: root-mean-square error of the fit on ``interval`` (None if unknown).
    """

    def evaluate(self, x: torch.Tensor) -> torch.Tensor:
        """``R(x)`` in ``x``'s dtype."""
        poly = self._poly.to(device=x.device, dtype=x.dtype)
        out = torch.zeros_like(x)
        for c in poly.flip(0):  # Horner
            out = out * x + c
        for a, b, p, q in self._atoms.to(device=x.device, dtype=x.dtype):
            out = out + (a + b * (x - p)) / ((x - p) ** 2 + q**2)
        return out

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (inverse of [`from_dict`][ralimp.RationalFunction.from_dict])."""
        return {
            "poly": self.poly,
            "atoms": [list(a) for a in self.atoms],
            "interval": list(self.interval),
            "max_error": self.max_error,
            "rms_error": self.rms_error,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RationalFunction:
        """Rebuild from [`to_dict`][ralimp.RationalFunction.to_dict] output."""
        return cls(
            data["poly"],
            data["atoms"],
            tuple(data["interval"]),
            data.get("max_error"),
            data.get("rms_error"),
        )

    def __repr__(self) -> str:
        err = "" if self.max_error is None else f", max_error={self.max_error:.2e}"
        return f"RationalFunction(K={self.poly_degree}, J={self.num_atoms}, interval={self.interval}{err})"


def grid_errors(
    approx: Callable[[torch.Tensor], torch.Tensor],
    fn: Callable[[torch.Tensor], torch.Tensor],
    interval: tuple[float, float],
    points: int,
) -> tuple[float, float]:
    """``(max, rms)`` absolute error of ``approx`` against ``fn`` on a float64 grid over ``interval``."""
    t = torch.linspace(*interval, points, dtype=torch.float64)
    err = approx(t) - fn(t)
    return float(err.abs().max()), float(err.pow(2).mean().sqrt())


def _basis(t: torch.Tensor, p: torch.Tensor, q: torch.Tensor, poly_degree: int) -> torch.Tensor:
    """Columns $t^0..t^K$, then per atom $1/D$ and $(t - p)/D$ with $D = (t - p)^2 + q^2$."""
    cols = [t.unsqueeze(-1) ** torch.arange(poly_degree + 1, dtype=t.dtype)]
    if p.numel():
        d = t.unsqueeze(-1) - p
        den = d**2 + q**2
        cols += [1 / den, d / den]
    return torch.cat(cols, dim=-1)


def _solve_linear(basis: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Least-squares coefficients of ``f`` in ``basis`` (columns scaled to unit norm first).

    Not `ralimp.ridge.scaled_ridge_solve`: an unpenalized problem, solved on the design matrix itself (QR,
    `torch.linalg.lstsq`) rather than its normal equations, whose condition number is the square of the
    design's (the rational columns are close to collinear for nearby poles).
    """
    scale = basis.norm(dim=0).clamp_min(1e-300)
    return torch.linalg.lstsq(basis / scale, f.unsqueeze(-1)).solution.squeeze(-1) / scale


def fit_rational(
    fn: Callable[[torch.Tensor], torch.Tensor] | str,
    interval: tuple[float, float] = DEFAULT_INTERVAL,
    *,
    num_atoms: int,
    poly_degree: int,
    q_floor: float = 0.05,
    num_points: int = 2001,
    num_starts: int = 8,
    max_iter: int = 150,
    seed: int = 0,
) -> RationalFunction:
    r"""Fit $R(t) = P(t) + \sum_j (A_j + B_j (t - p_j)) / ((t - p_j)^2 + q_j^2)$ to ``fn`` on ``interval``.

    A float64 least-squares fit on a uniform grid of ``num_points``, directly in partial-fraction form:
    the widths are ``q_j = softplus(rho_j) + q_floor``, so no pole can reach the real axis. The problem is
    separable (variable projection, Golub and Pereyra 1973): for fixed poles ``(p, q)`` the coefficients
    ``c, A, B`` are a linear least-squares solution, so Levenberg-Marquardt (central-difference Jacobian)
    runs on the ``2J`` pole parameters only, from ``num_starts`` starts (the first has the poles spread
    evenly over the interval, the others are random); the best fit wins.

    Args:
        fn: an elementwise function of a float64 tensor, or a registered activation name.
        interval: ``(a, b)``, the interval of the fit.
        num_atoms: $J \ge 0$ (0 fits the polynomial alone).
        poly_degree: $K \ge 0$.
        q_floor: smallest pole width allowed.
        num_points: grid size.
        num_starts: Levenberg-Marquardt starts.
        max_iter: iterations per start.
        seed: seed of the random starts.

    Returns:
        the fitted [`RationalFunction`][ralimp.RationalFunction] with its ``max_error`` and ``rms_error`` on
        the grid.
    """
    fn = ACTIVATIONS.get(fn) if isinstance(fn, str) else fn
    check_int("num_atoms", num_atoms, 0)
    check_int("poly_degree", poly_degree, 0)
    a, b = (float(v) for v in interval)
    if not a < b:
        raise ValueError(f"interval: expected (a, b) with a < b, got {interval!r}")
    if not q_floor > 0:
        raise ValueError(f"q_floor: expected a positive width, got {q_floor!r}")
    check_positive_int("num_starts", num_starts)
    t = torch.linspace(a, b, check_positive_int("num_points", num_points), dtype=torch.float64)
    f = fn(t).to(torch.float64)
    half = (b - a) / 2

    def unpack(theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return theta[:num_atoms], F.softplus(theta[num_atoms:]) + q_floor

    def residual(theta: torch.Tensor) -> torch.Tensor:
        basis = _basis(t, *unpack(theta), poly_degree)
        return basis @ _solve_linear(basis, f) - f

    gen = torch.Generator().manual_seed(seed)
    best, best_cost = torch.zeros(2 * num_atoms, dtype=torch.float64), math.inf
    for start in range(num_starts if num_atoms else 1):
        if start == 0:
            p0 = a + (torch.arange(num_atoms, dtype=torch.float64) + 0.5) * (b - a) / max(num_atoms, 1)
            q0 = torch.full((num_atoms,), half / 2, dtype=torch.float64)
        else:
            p0 = a + (b - a) * torch.rand(num_atoms, generator=gen, dtype=torch.float64)
            q0 = half * (0.05 + 0.95 * torch.rand(num_atoms, generator=gen, dtype=torch.float64))
        rho0 = torch.log(torch.expm1((q0 - q_floor).clamp_min(1e-3)))
        theta = levenberg_marquardt(residual, torch.cat([p0, rho0]), max_iter)
        cost = float(residual(theta).pow(2).sum())
        if cost < best_cost:
            best, best_cost = theta, cost
    p, q = unpack(best)
    basis = _basis(t, p, q, poly_degree)
    coef = _solve_linear(basis, f)
    atoms = torch.stack([coef[poly_degree + 1 :][:num_atoms], coef[poly_degree + 1 + num_atoms :], p, q], -1)
    fit = RationalFunction(coef[: poly_degree + 1], atoms, (a, b))
    fit.max_error, fit.rms_error = fit.errors(fn, num_points)
    return fit


def levenberg_marquardt(
    residual: Callable[[torch.Tensor], torch.Tensor], theta: torch.Tensor, max_iter: int
) -> torch.Tensor:
    r"""Minimize $\lVert \mathrm{res}(\theta)\rVert^2$ by Levenberg-Marquardt, central-difference Jacobian."""
    if theta.numel() == 0:
        return theta
    r = residual(theta)
    cost, mu = float(r @ r), 1e-3
    for _ in range(max_iter):
        h = 1e-6 * theta.abs().clamp_min(1.0)
        cols = []
        for i in range(theta.numel()):
            e = torch.zeros_like(theta)
            e[i] = h[i]
            cols.append((residual(theta + e) - residual(theta - e)) / (2 * h[i]))
        jac = torch.stack(cols, -1)
        jtj, jtr = jac.mT @ jac, jac.mT @ r
        improved = False
        for _ in range(10):
            lhs = jtj + mu * torch.diag(jtj.diagonal().clamp_min(1e-12))
            step = torch.linalg.solve(lhs, -jtr)
            candidate = theta + step
            r_new = residual(candidate)
            new_cost = float(r_new @ r_new)
            if math.isfinite(new_cost) and new_cost < cost:
                theta, r, mu, improved = candidate, r_new, max(mu / 3, 1e-12), True
                relative = (cost - new_cost) / max(cost, 1e-300)
                cost = new_cost
                break
            mu *= 4
        if not improved or relative < 1e-12:
            break
    return theta


@functools.cache
def shipped_fits() -> dict[str, Any]:
    """The contents of ``ralimp/fits.json`` (read once)."""
    return json.loads(resources.files("ralimp").joinpath("fits.json").read_text())


def shipped_fit_key(activation: str, poly_degree: int, num_atoms: int) -> str:
    """The key of a fit in ``fits.json``: ``"gelu/K2/J1"``."""
    return f"{activation}/K{poly_degree}/J{num_atoms}"


def activation_fit(
    activation: str,
    *,
    poly_degree: int = 2,
    num_atoms: int = 1,
    interval: tuple[float, float] = DEFAULT_INTERVAL,
) -> RationalFunction:
    """The continuous rational fit of a registered activation: the shipped one if it exists, else fitted now.

    Fits of the shipped activations (``ralimp.fit_activations.SHIPPED``) on ``[-4, 4]`` for ``K = 1..3`` and
    ``J = 0..3`` ship in ``ralimp/fits.json`` (recomputed by ``ralimp-fit``); other intervals or degrees are
    fitted by `fit_rational` (a few seconds). A RaLiMP layer uses `ralimp.layer_fit`, the fit
    in its discretized basis.
    """
    fn = ACTIVATIONS.get(activation)
    data = shipped_fits()["fits"].get(shipped_fit_key(activation, poly_degree, num_atoms))
    if data is not None and tuple(data["interval"]) == tuple(float(v) for v in interval):
        return RationalFunction.from_dict(data)
    return fit_rational(fn, interval, num_atoms=num_atoms, poly_degree=poly_degree)
