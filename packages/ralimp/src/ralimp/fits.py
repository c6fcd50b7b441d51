r"""The fit modes of a RaLiMP on its calibration sample, and the choice of the number of atoms $J$.

The fit modes (`FITS`, ``fit=``), each a function of the target, the `ralimp.calibration.Calibration`, the
layer's `Sizes` and its `FitOptions`, returning the `ralimp.DiscretizedFit` in $t$ units:

- ``"variance"``: minimizes the layer's expected squared error on the sample, bias$^2$ plus the exact
  variance of its $\Psi(W)$ readout over the random projections (Prop. 1 for every node, Prop. 2 for the
  polynomial block). The variance is a quadratic form $c^\top \Sigma(q) c$ in the coefficients, so for given
  widths $q$ the coefficients solve a generalized ridge problem, and the widths are chosen on a log grid
  (coordinate descent over atoms).
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
from ralimp.calibration import Calibration, check_scale
from ralimp.discretized import DiscretizedFit, fit_discretized, gauge, node_basis, nodewise_quadrature
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


def basis_covariance(cal: Calibration, sizes: Sizes, widths: torch.Tensor) -> torch.Tensor:
    """The block-diagonal covariance of the columns of `ralimp.discretized.node_basis` (poly, cos, sin)."""
    k1, jn = sizes.poly_degree + 1, sizes.num_atoms * sizes.num_freqs
    cov = torch.zeros(k1 + 2 * jn, k1 + 2 * jn, dtype=cal.t.dtype)
    if sizes.poly_degree:
        cov[:k1, :k1] = cal.poly_covariance(sizes.poly_degree, sizes.poly_features)
    if jn:
        nodes = gauss_laguerre(sizes.num_freqs)[0].to(cal.t)
        freqs = (nodes / widths.unsqueeze(-1)).reshape(-1)
        blocks = cal.node_covariance(freqs, sizes.freq_features)
        idx = torch.arange(jn)
        cov[k1 + idx, k1 + idx] = blocks[:, 0, 0]
        cov[k1 + jn + idx, k1 + jn + idx] = blocks[:, 1, 1]
        cov[k1 + idx, k1 + jn + idx] = blocks[:, 0, 1]
        cov[k1 + jn + idx, k1 + idx] = blocks[:, 0, 1]
    return cov


def _bias_points(cal: Calibration, interval: tuple[float, float] | None) -> torch.Tensor:
    """Where the bias is measured: the sample's pre-activations, or a uniform grid of ``interval``."""
    if interval is None:
        return cal.t
    return torch.linspace(float(interval[0]), float(interval[1]), 2001, dtype=torch.float64)


def _solve(
    fn: Elementwise, cal: Calibration, sizes: Sizes, widths: torch.Tensor, points: torch.Tensor
) -> tuple[torch.Tensor, float]:
    r"""Coefficients minimizing mean bias$^2$ + $c^\top \Sigma c$ for ``widths`` (t units), and that cost."""
    nodes = gauss_laguerre(max(sizes.num_freqs, 1))[0][: sizes.num_freqs].to(points)
    basis = node_basis(points, widths, nodes, sizes.poly_degree)
    f = fn(points).to(torch.float64)
    cov = basis_covariance(cal, sizes, widths)
    if not torch.isfinite(cov).all():
        return torch.zeros(basis.shape[1], dtype=torch.float64), math.inf
    coef = scaled_ridge_solve(basis, f, penalty=cov)
    cost = float((basis @ coef - f).pow(2).mean() + coef @ cov @ coef)
    return coef, cost if math.isfinite(cost) else math.inf


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
    the sample's pre-activations (on a uniform grid of ``interval`` when one is given). Centers $p = 0$ (they
    do not change $\mathbb E\, y$, `ralimp.discretized`).
    """
    q_floor, interval = options.q_floor, options.interval
    tau2 = cal.tau**2
    points = _bias_points(cal, interval)
    reach = float(points.abs().max()) / tau2
    candidates = torch.logspace(
        math.log10(q_floor), math.log10(max(1e3 * reach, 10 * q_floor)), grid, dtype=torch.float64
    )
    widths = candidates[torch.linspace(grid // 2, grid - 1, max(sizes.num_atoms, 1)).long()][
        : sizes.num_atoms
    ]
    for _ in range(sweeps if sizes.num_atoms > 1 else sizes.num_atoms):
        for j in range(sizes.num_atoms):
            costs = []
            for q in candidates:
                trial = widths.clone()
                trial[j] = q
                costs.append(_solve(fn, cal, sizes, trial * tau2, points)[1])
            widths[j] = candidates[int(torch.tensor(costs).argmin())]
    q = widths * tau2
    coef, _ = _solve(fn, cal, sizes, q, points)
    k1, jn = sizes.poly_degree + 1, sizes.num_atoms * sizes.num_freqs
    w_c = coef[k1 : k1 + jn].reshape(sizes.num_atoms, sizes.num_freqs)
    w_s = coef[k1 + jn :].reshape(sizes.num_atoms, sizes.num_freqs)
    nodes = gauss_laguerre(sizes.num_freqs)[0]
    atoms, rho_c, rho_s = gauge(w_c, w_s, torch.zeros_like(q), q, nodes)
    fit = DiscretizedFit(coef[:k1], atoms, rho_c, rho_s, interval or cal.fit_range)
    fit.max_error, fit.rms_error = fit.errors(fn)
    return fit


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

    Each $j$ is fitted (`variance_fit`) and scored by `expected_squared_error` on ``cal`` (bias$^2$ + exact
    variance). The random features that fewer atoms free go to the polynomial block, so the budget as
    ``options.budget_count`` counts it stays as given; a $j$ whose freed features the polynomial block cannot
    take exactly is skipped.
    """
    degree, atoms, freqs = sizes.poly_degree, sizes.num_atoms, sizes.num_freqs
    m_poly, m_freq = sizes.poly_features, sizes.freq_features
    per_poly = 1 if check_count(options.budget_count) == "paper" else degree
    best: tuple[float, Sizes, DiscretizedFit] | None = None
    for j in range(atoms, -1, -1):
        freed = 2 * (atoms - j) * freqs * m_freq
        if (j == 0 and degree == 0) or (freed and (not degree or freed % per_poly)):
            continue
        candidate = Sizes(degree, j, freqs, m_poly + freed // per_poly if degree else m_poly, m_freq)
        fit = variance_fit(fn, cal, candidate, options)
        cost = expected_squared_error(fit, fn, cal, candidate)
        if best is None or cost < best[0]:
            best = (cost, candidate, fit)
    assert best is not None, "j = num_atoms is always a candidate"
    return best[1], best[2]
