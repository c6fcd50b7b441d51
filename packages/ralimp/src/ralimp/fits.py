r"""The fit modes of a RaLiMP on its calibration sample, and the choice of the number of atoms $J$.

The fit modes (`FITS`, ``fit=``), each a function of the target, the `ralimp.calibration.Calibration`, the
layer's `Sizes` and its `FitOptions`, returning the `ralimp.DiscretizedFit` in $t$ units:

- ``"variance"``: minimizes the layer's expected squared error on the sample, bias$^2$ plus the exact
  variance of its $\Psi(W)$ readout over the random projections (Prop. 1 for every node, Prop. 2 for the
  polynomial block). The variance is a quadratic form $c^\top \Sigma(q) c$ in the coefficients, so for given
  widths $q$ the coefficients solve a generalized ridge problem, and the widths are chosen on a log grid
  (coordinate descent over atoms). `WidthSearch` computes the covariance of every node at every width of the
  grid once and solves the candidates in batches.
- ``"discretized"``: least squares of $f$ in the layer's basis on the fit range (`ralimp.fit_discretized`).
- ``"paper"``: the continuous rational fit on the fit range, discretized node by node with the
  Gauss-Laguerre weights $\gamma_k$ (the paper's initialization).

Widths are bounded below by ``q_floor`` in $v = t / \tau^2$ units, and an atom given by the user (a
`ralimp.RationalFunction`) is realized as $a(t / \tau^2)$ (`dilated`). `choose_atoms` picks
$j = 0..J$ by the expected squared error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol, Self

import torch

from ralimp.budget import check_count
from ralimp.calibration import CHUNK_ELEMENTS, Calibration, check_scale
from ralimp.discretized import (
    DiscretizedFit,
    fit_discretized,
    gauge,
    nodewise_quadrature,
    poly_columns,
    with_nodes,
)
from ralimp.quadrature import gauss_laguerre
from ralimp.rational import RationalFunction, fit_rational
from ralimp.ridge import scaled_ridge_solve
from spectraformer_core import Registry

Elementwise = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Sizes:
    """The layer's shape as the fit sees it: ``K``, ``J``, nodes per atom, projections per block.

    The defaults are `ralimp.RaLiMP`'s.
    """

    poly_degree: int = 2
    num_atoms: int = 1
    num_freqs: int = 3
    poly_features: int = 8
    freq_features: int = 4

    def canonical(self) -> Sizes:
        """These sizes with the projections of an absent block set to 1 (they change no fit)."""
        return replace(
            self,
            poly_features=self.poly_features if self.poly_degree else 1,
            freq_features=self.freq_features if self.num_atoms else 1,
        )

    @classmethod
    def of(cls, options: dict[str, Any]) -> Self:
        """The sizes named flat in ``options`` (`from_linear`'s keywords), over ``options["sizes"]``.

        The defaults for the others when ``options`` has no ``"sizes"``.
        """
        return replace(options.get("sizes") or cls(), **_named(cls, options))


@dataclass(frozen=True)
class FitOptions:
    """How a RaLiMP is fitted: mode, dilation, balance, range, width floor, budget count.

    The defaults are `ralimp.RaLiMP`'s (its constructor documents each option).
    """

    fit: str = "variance"
    tau: float | str = "auto"
    tau_c: float = 1.0
    balance: float | str = 1.0
    interval: tuple[float, float] | None = None
    q_floor: float = 0.05
    budget_count: str = "paper"

    def __post_init__(self) -> None:
        """Raise a ``ValueError`` naming the first option out of its range; keep the numbers as floats."""
        check_scale("tau", self.tau)
        check_scale("balance", self.balance)
        if not self.tau_c > 0:
            raise ValueError(f"tau_c: expected a positive constant, got {self.tau_c!r}")
        if not self.q_floor > 0:
            raise ValueError(f"q_floor: expected a positive width, got {self.q_floor!r}")
        FITS.get(self.fit)
        check_count(self.budget_count)
        # numbers as floats (a TOML file or a caller may give ints and lists)
        object.__setattr__(self, "tau_c", float(self.tau_c))
        object.__setattr__(self, "q_floor", float(self.q_floor))
        if self.interval is not None:
            object.__setattr__(self, "interval", (float(self.interval[0]), float(self.interval[1])))

    @classmethod
    def of(cls, options: dict[str, Any]) -> Self:
        """The fit options named flat in ``options`` (`from_linear`'s keywords), over ``options["options"]``.

        The defaults for the others when ``options`` has no ``"options"``.
        """
        return replace(options.get("options") or cls(), **_named(cls, options))


def _named(cls: type, options: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``options`` that name a field of the dataclass ``cls``."""
    return {f.name: options[f.name] for f in fields(cls) if f.name in options}


def covariance_matrix(poly: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    r"""The block-diagonal covariance ``(..., F, F)`` of the columns of `ralimp.discretized.node_basis`.

    ``poly`` ``(K + 1, K + 1)``: the polynomial block; ``nodes`` ``(..., J n, 2, 2)``: per node, the
    covariance of its $(\cos, \sin)$ estimators (columns $j n + k$ of the cos and of the sin block).
    """
    k1, jn = poly.shape[-1], nodes.shape[-3]
    cov = torch.zeros(*nodes.shape[:-3], k1 + 2 * jn, k1 + 2 * jn, dtype=poly.dtype)
    cov[..., :k1, :k1] = poly
    idx = torch.arange(jn)
    cov[..., k1 + idx, k1 + idx] = nodes[..., 0, 0]
    cov[..., k1 + jn + idx, k1 + jn + idx] = nodes[..., 1, 1]
    cov[..., k1 + idx, k1 + jn + idx] = nodes[..., 0, 1]
    cov[..., k1 + jn + idx, k1 + idx] = nodes[..., 0, 1]
    return cov


def _poly_block(cal: Calibration, poly_degree: int, rows: int) -> torch.Tensor:
    """`Calibration.poly_covariance`, or the zero ``(1, 1)`` block of a layer without polynomial features."""
    if poly_degree:
        return cal.poly_covariance(poly_degree, rows)
    return torch.zeros(1, 1, dtype=cal.t.dtype)


def basis_covariance(cal: Calibration, sizes: Sizes, widths: torch.Tensor) -> torch.Tensor:
    """The covariance of the columns of `ralimp.discretized.node_basis` (poly, cos, sin) at ``widths`` (t)."""
    jn = sizes.num_atoms * sizes.num_freqs
    blocks = torch.zeros(0, 2, 2, dtype=cal.t.dtype)
    if jn:
        nodes = gauss_laguerre(sizes.num_freqs)[0].to(cal.t)
        blocks = cal.node_covariance((nodes / widths.unsqueeze(-1)).reshape(-1), sizes.freq_features)
    return covariance_matrix(_poly_block(cal, sizes.poly_degree, sizes.poly_features), blocks)


def expected_squared_error(fit: DiscretizedFit, fn: Elementwise, cal: Calibration, sizes: Sizes) -> float:
    r"""$\operatorname{mean}(\mathbb E y - f)^2 + \operatorname{mean} \operatorname{Var} y$ over the pairs.

    The expected squared error of the layer's $\Psi(W)$ readout over its random projections, averaged over the
    calibration pairs (exact for i.i.d. $\mathcal N(0, I)$ projections).
    """
    w_c, w_s = fit.coefficients()
    coef = torch.cat([torch.tensor(fit.poly, dtype=torch.float64), w_c.reshape(-1), w_s.reshape(-1)])
    widths = torch.tensor([a[3] for a in fit.atoms], dtype=torch.float64)
    bias = (fit(cal.t) - fn(cal.t).to(torch.float64)).pow(2).mean()
    return float(bias + coef @ basis_covariance(cal, sizes, widths) @ coef)


class WidthSearch:
    r"""The candidate widths of `variance_fit` and what every candidate shares, computed once.

    The candidates are a log grid of ``grid`` widths in $v = t / \tau^2$ units, from ``q_floor`` to
    $10^3 \max|v|$. The bias is measured on ``points``: the calibration pairs' pre-activations, or a uniform
    grid of ``interval`` when one is given (their polynomial columns computed once). A candidate gives every
    atom one of the grid's widths; its covariance (`covariance_matrix`) is put together from the polynomial
    block and the covariance of every node at every grid width over the pairs (Prop. 1), each computed once
    per projection, at its first use; its coefficients solve one batched generalized ridge problem with the
    other candidates' (`solve`). `choose_atoms` shares one search among the $J$ it tries.

    Args:
        fn: the activation.
        cal: the calibration.
        options: the fit options (``q_floor``, ``interval``).
        poly_degree: $K$ of every candidate.
        num_freqs: Gauss-Laguerre nodes per atom of every candidate.
        grid: the number of candidate widths.
    """

    def __init__(
        self,
        fn: Elementwise,
        cal: Calibration,
        options: FitOptions,
        *,
        poly_degree: int,
        num_freqs: int,
        grid: int = 40,
    ) -> None:
        self.fn, self.cal, self.interval = fn, cal, options.interval
        self.poly_degree, self.num_freqs = poly_degree, num_freqs
        self.points = _bias_points(cal, options.interval)
        self.target = fn(self.points).to(torch.float64)
        self.poly = poly_columns(self.points, poly_degree)
        q_floor, reach = options.q_floor, float(self.points.abs().max()) / cal.tau**2
        self.widths = torch.logspace(
            math.log10(q_floor), math.log10(max(1e3 * reach, 10 * q_floor)), grid, dtype=torch.float64
        )
        self.nodes = gauss_laguerre(max(num_freqs, 1))[0][:num_freqs].to(self.points)
        self._poly_moments: torch.Tensor | None = None
        self._node_moments: torch.Tensor | None = None

    def poly_moments(self) -> torch.Tensor:
        """The polynomial block of one projection, ``(K + 1, K + 1)`` (computed at the first call)."""
        if self._poly_moments is None:
            self._poly_moments = _poly_block(self.cal, self.poly_degree, 1)
        return self._poly_moments

    def node_moments(self) -> torch.Tensor:
        """The covariance of one projection's estimators per grid width and node, ``(grid, n, 2, 2)``."""
        if self._node_moments is None:
            freqs = self.nodes / (self.widths * self.cal.tau**2).unsqueeze(-1)  # t units
            table = self.cal.node_covariance(freqs.reshape(-1), 1)
            self._node_moments = table.reshape(*freqs.shape, 2, 2)
        return self._node_moments

    def solve(self, sizes: Sizes, choices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Coefficients ``(C, F)`` and costs ``(C,)`` (mean bias$^2$ + $c^\top \Sigma c$) of candidates.

        ``choices`` ``(C, J)``: each candidate's atom widths as indices into ``widths``. The coefficients
        minimize the cost (`ralimp.ridge.scaled_ridge_solve`, batched in chunks of
        `ralimp.calibration.CHUNK_ELEMENTS` basis entries). A candidate whose covariance or cost is not
        finite costs ``inf`` (with coefficients 0 when its covariance is not finite).
        """
        tau2 = self.cal.tau**2
        poly = self.poly_moments() / sizes.poly_features
        atoms = choices.shape[-1]
        width = self.poly_degree + 1 + 2 * atoms * self.num_freqs
        per_chunk = max(1, CHUNK_ELEMENTS // (self.points.numel() * width))
        coefs, costs = [], []
        for part in choices.split(per_chunk):
            basis = with_nodes(self.poly, self.points, self.widths[part] * tau2, self.nodes)
            if atoms:
                nodes = self.node_moments()[part].flatten(-4, -3) / sizes.freq_features
            else:
                nodes = torch.zeros(part.shape[0], 0, 2, 2, dtype=poly.dtype)
            cov = covariance_matrix(poly, nodes)
            finite = cov.isfinite().all(-1).all(-1)
            cov = torch.where(finite[:, None, None], cov, 0.0)
            coef = scaled_ridge_solve(basis, self.target, penalty=cov)
            coef = torch.where(finite[:, None], coef, 0.0)
            bias = (basis @ coef.unsqueeze(-1)).squeeze(-1).sub_(self.target).pow_(2).mean(-1)
            cost = bias + (coef.unsqueeze(-2) @ cov @ coef.unsqueeze(-1)).reshape(-1)
            coefs.append(coef)
            costs.append(torch.where(finite & cost.isfinite(), cost, math.inf))
        return torch.cat(coefs), torch.cat(costs)

    def fit(self, sizes: Sizes, sweeps: int = 2) -> DiscretizedFit:
        r"""The fit of a layer of ``sizes`` minimizing bias$^2$ + exact variance over the grid of widths.

        Coordinate descent over the atoms, ``sweeps`` rounds (one for a single atom): each atom's width in
        turn is the best of the grid with the others fixed. Costs are compared in float32, so candidates
        within its resolution ($6 \cdot 10^{-8}$ relative) tie and the narrowest wins. Centers $p = 0$ (they
        do not change $\mathbb E\, y$, `ralimp.discretized`).
        """
        if (sizes.poly_degree, sizes.num_freqs) != (self.poly_degree, self.num_freqs):
            raise ValueError(
                f"sizes: this search is for poly_degree={self.poly_degree}, num_freqs={self.num_freqs}, "
                f"got {sizes}"
            )
        grid, atoms = self.widths.numel(), sizes.num_atoms
        choice = torch.linspace(grid // 2, grid - 1, max(atoms, 1)).long()[:atoms]
        coef = None
        for _ in range(sweeps if atoms > 1 else atoms):
            for j in range(atoms):
                trials = choice.repeat(grid, 1)
                trials[:, j] = torch.arange(grid)
                coefs, costs = self.solve(sizes, trials)
                choice[j] = int(costs.float().argmin())
                coef = coefs[choice[j]]
        if coef is None:  # no atom: one candidate
            coef = self.solve(sizes, choice.unsqueeze(0))[0][0]
        q = self.widths[choice] * self.cal.tau**2
        k1, jn = sizes.poly_degree + 1, atoms * sizes.num_freqs
        w_c = coef[k1 : k1 + jn].reshape(atoms, sizes.num_freqs)
        w_s = coef[k1 + jn :].reshape(atoms, sizes.num_freqs)
        table, rho_c, rho_s = gauge(w_c, w_s, torch.zeros_like(q), q, gauss_laguerre(sizes.num_freqs)[0])
        fit = DiscretizedFit(coef[:k1], table, rho_c, rho_s, self.interval or self.cal.fit_range)
        fit.max_error, fit.rms_error = fit.errors(self.fn)
        return fit


def _bias_points(cal: Calibration, interval: tuple[float, float] | None) -> torch.Tensor:
    """Where the bias is measured: the sample's pre-activations, or a uniform grid of ``interval``."""
    if interval is None:
        return cal.t
    return torch.linspace(float(interval[0]), float(interval[1]), 2001, dtype=torch.float64)


class FitMode(Protocol):
    """A fit of ``fn`` for a layer of ``sizes`` on ``cal``: returns the `DiscretizedFit` in $t$ units."""

    def __call__(
        self, fn: Elementwise, cal: Calibration, sizes: Sizes, options: FitOptions
    ) -> DiscretizedFit:
        """Fit ``fn``."""
        ...


#: The fit modes of `ralimp.RaLiMP` (``fit=``): ``"variance"``, ``"discretized"``, ``"paper"``.
FITS: Registry[FitMode] = Registry("fit mode")


@FITS.register("variance")
def variance_fit(
    fn: Elementwise, cal: Calibration, sizes: Sizes, options: FitOptions, *, grid: int = 40, sweeps: int = 2
) -> DiscretizedFit:
    r"""The fit minimizing bias$^2$ + exact variance of the layer on ``cal`` (module docstring).

    Widths in $v = t / \tau^2$ units on a log grid of ``grid`` values from ``q_floor`` to $10^3 \max|v|$,
    ``sweeps`` rounds of coordinate descent over the atoms (one for a single atom); the bias is measured on
    the sample's pre-activations (on a uniform grid of ``interval`` when one is given). `WidthSearch.fit`.
    """
    search = WidthSearch(
        fn, cal, options, poly_degree=sizes.poly_degree, num_freqs=sizes.num_freqs, grid=grid
    )
    return search.fit(sizes, sweeps)


@FITS.register("discretized")
def least_squares_fit(fn: Elementwise, cal: Calibration, sizes: Sizes, options: FitOptions) -> DiscretizedFit:
    """`ralimp.fit_discretized` on the fit range (or ``interval``), widths >= ``q_floor`` in $v$ units."""
    return fit_discretized(
        fn,
        options.interval or cal.fit_range,
        poly_degree=sizes.poly_degree,
        num_atoms=sizes.num_atoms,
        num_freqs=sizes.num_freqs,
        q_floor=options.q_floor * cal.tau**2,
    )


@FITS.register("paper")
def paper_fit(fn: Elementwise, cal: Calibration, sizes: Sizes, options: FitOptions) -> DiscretizedFit:
    r"""The paper's initialization: the continuous fit on the fit range, node $k$ weighted by $\gamma_k$."""
    continuous = fit_rational(
        fn,
        options.interval or cal.fit_range,
        num_atoms=sizes.num_atoms,
        poly_degree=sizes.poly_degree,
        q_floor=options.q_floor * cal.tau**2,
    )
    return nodewise_quadrature(continuous, max(sizes.num_freqs, 1))


def dilated(rational: RationalFunction | DiscretizedFit, tau: float) -> RationalFunction | DiscretizedFit:
    r"""``rational`` with its atoms in $v = t / \tau^2$ rewritten in $t$ units: $a(t / \tau^2)$ (App. C.1).

    $(A, B, p, q) \to (A \tau^4, B \tau^2, p \tau^2, q \tau^2)$; the polynomial is unchanged.
    """
    t2 = tau**2
    atoms = rational.atom_table * torch.tensor([t2**2, t2, t2, t2], dtype=torch.float64)
    if isinstance(rational, DiscretizedFit):
        return DiscretizedFit(rational.poly, atoms, rational.node_cos, rational.node_sin, rational.interval)
    return RationalFunction(rational.poly, atoms, rational.interval)


def fit_layer(
    target: Elementwise | RationalFunction | DiscretizedFit,
    cal: Calibration,
    sizes: Sizes,
    options: FitOptions,
) -> DiscretizedFit:
    r"""The fit a RaLiMP of ``sizes`` makes of ``target`` on ``cal`` (``options.fit``), in $t$ units.

    A `ralimp.DiscretizedFit` target is used as is, dilated (`dilated`); a `ralimp.RationalFunction` is
    dilated, then discretized node by node (``fit="paper"``) or fitted like any callable.
    """
    if isinstance(target, DiscretizedFit):
        fit = dilated(target, cal.tau)
        assert isinstance(fit, DiscretizedFit)
        return fit
    if isinstance(target, RationalFunction):
        target = dilated(target, cal.tau)
        if options.fit == "paper":
            assert isinstance(target, RationalFunction)
            return nodewise_quadrature(target, sizes.num_freqs)
    return FITS.get(options.fit)(target, cal, sizes, options)


def choose_atoms(
    fn: Elementwise, cal: Calibration, sizes: Sizes, options: FitOptions
) -> tuple[Sizes, DiscretizedFit]:
    r"""The best $j = 0..J$ (``sizes.num_atoms``) by expected squared error, and its `variance_fit`.

    Each $j$ is fitted (`variance_fit`, one `WidthSearch` shared by all) and scored by
    `expected_squared_error` on ``cal`` (bias$^2$ + exact variance). The random features that fewer atoms
    free go to the polynomial block, so the budget as ``options.budget_count`` counts it stays as given; a $j$
    whose freed features the polynomial block cannot take exactly is skipped.
    """
    degree, atoms, freqs = sizes.poly_degree, sizes.num_atoms, sizes.num_freqs
    m_poly, m_freq = sizes.poly_features, sizes.freq_features
    per_poly = 1 if check_count(options.budget_count) == "paper" else degree
    search = WidthSearch(fn, cal, options, poly_degree=degree, num_freqs=freqs)
    best: tuple[float, Sizes, DiscretizedFit] | None = None
    for j in range(atoms, -1, -1):
        freed = 2 * (atoms - j) * freqs * m_freq
        if (j == 0 and degree == 0) or (freed and (not degree or freed % per_poly)):
            continue
        candidate = Sizes(degree, j, freqs, m_poly + freed // per_poly if degree else m_poly, m_freq)
        fit = search.fit(candidate)
        cost = expected_squared_error(fit, fn, cal, candidate)
        if best is None or cost < best[0]:
            best = (cost, candidate, fit)
    assert best is not None, "j = num_atoms is always a candidate"
    return best[1], best[2]
