r"""Where a RaLiMP is fitted: calibration sample, dilation $\tau$, fit modes (App. C.1, Props. 1-2).

A layer is fitted on the pre-activations its calibration sample really has: `calibrate` pairs every input
$x$ of the sample with every weight row $w$ (both subsampled) and keeps, per pair, $t = [x; 1] \cdot [w; b]$,
$\lVert[x; 1]\rVert^2$ and $\lVert[w; b]\rVert^2$. Without a sample the inputs are standard normal
(seeded draws), the assumption of the layer's documentation. The fit range is the robust quantile range of
$t$ (`Calibration.fit_range`).

The atoms live in the dilated variable $v = t / \tau^2$ (App. C.1: the rational features evaluated at
$u / \tau$ estimate $\cos(s_k t / \tau^2)$), with $\tau^2 = c \operatorname{RMS}(t)$ so that $v = O(1)$:
widths are bounded below by ``q_floor`` in $v$ units, and an atom given by the user (a `RationalFunction`) is
realized as $a(t / \tau^2)$.

The fit modes (`FITS`):

- ``"variance"``: minimizes the layer's expected squared error on the sample, bias$^2$ plus the exact
  variance of its $\Psi(W)$ readout over the random projections (Prop. 1 for every node, Prop. 2 for the
  polynomial block). The variance is a quadratic form $c^\top \Sigma(q) c$ in the coefficients, so for given
  widths $q$ the coefficients solve a generalized ridge problem, and the widths are chosen on a log grid
  (coordinate descent over atoms).
- ``"discretized"``: least squares of $f$ in the layer's basis on the fit range (`fit_discretized`).
- ``"paper"``: the continuous rational fit on the fit range, discretized node by node with the
  Gauss-Laguerre weights $\gamma_k$ (the paper's initialization).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from ralimp.discretized import DiscretizedFit, _gauge, _node_basis, fit_discretized, nodewise_quadrature
from ralimp.quadrature import gauss_laguerre
from ralimp.rational import RationalFunction, fit_rational
from ralimp.variance import atom_second_moments
from spectraformer_core import Registry

#: Lower and upper quantile of the pre-activations that bound the fit range.
RANGE_QUANTILE = 1e-3


@dataclass(frozen=True)
class Calibration:
    r"""Per (input, weight row) pair of a calibration sample, float64 ``(P,)`` each, and the layer's scales.

    Attributes:
        t: pre-activations $[x; 1] \cdot [w; b]$.
        x_sq: $\lVert[x; 1]\rVert^2$.
        w_sq: $\lVert[w; b]\rVert^2$.
        tau: the dilation $\tau$ (atoms in $v = t / \tau^2$).
        balance: $\lambda$ (rational features at $[x; 1] / \lambda$, $\lambda [w; b]$).
        synthetic: True when the inputs are standard-normal draws (no sample was given).
    """

    t: torch.Tensor
    x_sq: torch.Tensor
    w_sq: torch.Tensor
    tau: float
    balance: float
    synthetic: bool

    @property
    def fit_range(self) -> tuple[float, float]:
        """The ``(RANGE_QUANTILE, 1 - RANGE_QUANTILE)`` quantiles of ``t`` (widened to a nonzero interval)."""
        lo, hi = torch.quantile(
            self.t, torch.tensor([RANGE_QUANTILE, 1 - RANGE_QUANTILE]).to(self.t)
        ).tolist()
        half = max((hi - lo) / 2, 1e-3 * max(abs(lo), abs(hi), 1.0))
        mid = (hi + lo) / 2
        return (mid - half, mid + half)

    def pair_norm_sq(self) -> torch.Tensor:
        r"""$\lVert x / \lambda + \lambda w\rVert^2$ per pair: Prop. 1's exponent factor (times $s/q$)."""
        lam2 = self.balance**2
        return self.x_sq / lam2 + lam2 * self.w_sq + 2 * self.t


def calibrate(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    sample: torch.Tensor | None,
    *,
    tau: float,
    balance: float,
    max_inputs: int = 256,
    max_rows: int = 256,
    seed: int = 0,
) -> Calibration:
    """The `Calibration` of ``weight (L, d)``, ``bias (L,)`` on ``sample (..., d)`` (standard normal if None).

    At most ``max_inputs`` inputs and ``max_rows`` weight rows (seeded subsets) are paired.
    """
    gen = torch.Generator().manual_seed(seed)
    w = weight.detach().to(device="cpu", dtype=torch.float64)
    b = torch.zeros(w.shape[0], dtype=torch.float64) if bias is None else bias.detach().cpu().double()
    if sample is None:
        x = torch.randn(max_inputs, w.shape[1], generator=gen, dtype=torch.float64)
    else:
        x = sample.detach().reshape(-1, w.shape[1]).to(device="cpu", dtype=torch.float64)
        if x.shape[0] > max_inputs:
            x = x[torch.randperm(x.shape[0], generator=gen)[:max_inputs]]
    if w.shape[0] > max_rows:
        keep = torch.randperm(w.shape[0], generator=gen)[:max_rows]
        w, b = w[keep], b[keep]
    t = x @ w.mT + b
    x_sq = (x.pow(2).sum(-1) + 1).unsqueeze(-1).expand_as(t)
    w_sq = (w.pow(2).sum(-1) + b.pow(2)).unsqueeze(0).expand_as(t)
    return Calibration(
        t.reshape(-1),
        x_sq.reshape(-1),
        w_sq.reshape(-1),
        float(tau),
        float(balance),
        sample is None,
    )


def node_covariance(cal: Calibration, freq: torch.Tensor, rows: int) -> torch.Tensor:
    r"""Covariance of the estimators $(C, S)$ of $(\cos(a t), \sin(a t))$, mean over the pairs, ``(n, 2, 2)``.

    Prop. 1 with the cross moment (`ralimp.variance.atom_second_moments`) at the frequencies $a$ = ``freq``
    ``(n,)`` (in $t$ units: $a = s_k / q$), ``rows`` i.i.d. $\mathcal N(0, I)$ projections.
    The exponent $2\sigma^2$ is capped at 700 (float64), where the variance is astronomically large anyway.
    """
    a = freq.to(cal.t).unsqueeze(-1)
    sigma2 = (a / 2 * cal.pair_norm_sq()).clamp_max(350)
    lam2 = cal.balance**2
    big_h = a / 2 * (cal.x_sq / lam2 + lam2 * cal.w_sq)
    e_cc, e_ss, e_cs = atom_second_moments(sigma2, big_h)
    cos, sin = (a * cal.t).cos(), (a * cal.t).sin()
    cc, ss, cs = (e_cc - cos**2).mean(-1), (e_ss - sin**2).mean(-1), (e_cs - cos * sin).mean(-1)
    return torch.stack([torch.stack([cc, cs], -1), torch.stack([cs, ss], -1)], -2) / rows


def poly_covariance(cal: Calibration, poly_degree: int, rows: int) -> torch.Tensor:
    r"""Covariance of the product-feature estimators of $t^0..t^K$ averaged over the pairs, ``(K+1, K+1)``.

    Prop. 2 with shared projections: $\mathbb E[X_n X_{n'}] = M^{\min(n, n')} t^{|n - n'|}$,
    $M = \lVert x\rVert^2 \lVert w\rVert^2 + 2 t^2$, ``rows`` projections; $t^0$ is exact.
    """
    t = cal.t
    big_m = cal.x_sq * cal.w_sq + 2 * t**2
    cov = torch.zeros(poly_degree + 1, poly_degree + 1, dtype=t.dtype)
    for n in range(1, poly_degree + 1):
        for k in range(1, poly_degree + 1):
            cov[n, k] = (big_m ** min(n, k) * t ** abs(n - k) - t ** (n + k)).mean() / rows
    return cov


@dataclass(frozen=True)
class Sizes:
    """The layer's shape as the fit sees it: ``K``, ``J``, nodes per atom, projections per block."""

    poly_degree: int
    num_atoms: int
    num_freqs: int
    poly_features: int
    freq_features: int


def _covariance(cal: Calibration, sizes: Sizes, widths: torch.Tensor) -> torch.Tensor:
    """The block-diagonal covariance of the basis columns of `_node_basis` (polynomial, cos, sin)."""
    k1, jn = sizes.poly_degree + 1, sizes.num_atoms * sizes.num_freqs
    cov = torch.zeros(k1 + 2 * jn, k1 + 2 * jn, dtype=cal.t.dtype)
    if sizes.poly_degree:
        cov[:k1, :k1] = poly_covariance(cal, sizes.poly_degree, sizes.poly_features)
    if jn:
        nodes = gauss_laguerre(sizes.num_freqs)[0].to(cal.t)
        freqs = (nodes / widths.unsqueeze(-1)).reshape(-1)
        blocks = node_covariance(cal, freqs, sizes.freq_features)
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
    fn: Callable[[torch.Tensor], torch.Tensor],
    cal: Calibration,
    sizes: Sizes,
    widths: torch.Tensor,
    points: torch.Tensor,
) -> tuple[torch.Tensor, float]:
    r"""Coefficients minimizing mean bias$^2$ + $c^\top \Sigma c$ for ``widths`` (t units), and that cost."""
    nodes = gauss_laguerre(max(sizes.num_freqs, 1))[0][: sizes.num_freqs].to(points)
    basis = _node_basis(points, widths, nodes, sizes.poly_degree)
    f = fn(points).to(torch.float64)
    cov = _covariance(cal, sizes, widths)
    if not torch.isfinite(cov).all():
        return torch.zeros(basis.shape[1], dtype=torch.float64), math.inf
    scale = basis.pow(2).mean(0).sqrt().clamp_min(1e-300)
    scaled = basis / scale
    gram = scaled.mT @ scaled / basis.shape[0] + cov / scale.outer(scale)
    gram.diagonal().add_(1e-12)
    coef = torch.linalg.solve(gram, scaled.mT @ f / basis.shape[0]) / scale
    cost = float((basis @ coef - f).pow(2).mean() + coef @ cov @ coef)
    return coef, cost if math.isfinite(cost) else math.inf


def expected_squared_error(
    fit: DiscretizedFit,
    fn: Callable[[torch.Tensor], torch.Tensor],
    cal: Calibration,
    sizes: Sizes,
) -> float:
    r"""$\operatorname{mean}(\mathbb E y - f)^2 + \operatorname{mean} \operatorname{Var} y$ over the pairs.

    The expected squared error of the layer's $\Psi(W)$ readout over its random projections, averaged over the
    calibration pairs (exact for i.i.d. $\mathcal N(0, I)$ projections).
    """
    w_c, w_s = fit.coefficients()
    coef = torch.cat([torch.tensor(fit.poly, dtype=torch.float64), w_c.reshape(-1), w_s.reshape(-1)])
    widths = torch.tensor([a[3] for a in fit.atoms], dtype=torch.float64)
    bias = (fit(cal.t) - fn(cal.t).to(torch.float64)).pow(2).mean()
    return float(bias + coef @ _covariance(cal, sizes, widths) @ coef)


class FitMode(Protocol):
    """A fit of ``fn`` for a layer of ``sizes`` on ``cal``: returns the `DiscretizedFit` in $t$ units."""

    def __call__(
        self,
        fn: Callable[[torch.Tensor], torch.Tensor],
        cal: Calibration,
        sizes: Sizes,
        *,
        interval: tuple[float, float] | None,
        q_floor: float,
    ) -> DiscretizedFit:
        """Fit ``fn``."""
        ...


#: The fit modes of `ralimp.RaLiMP` (``fit=``): ``"variance"``, ``"discretized"``, ``"paper"``.
FITS: Registry[FitMode] = Registry("fit mode")


@FITS.register("variance")
def variance_fit(
    fn: Callable[[torch.Tensor], torch.Tensor],
    cal: Calibration,
    sizes: Sizes,
    *,
    interval: tuple[float, float] | None = None,
    q_floor: float = 0.05,
    grid: int = 40,
    sweeps: int = 2,
) -> DiscretizedFit:
    r"""The fit minimizing bias$^2$ + exact variance of the layer on ``cal`` (module docstring).

    Widths in $v = t / \tau^2$ units on a log grid of ``grid`` values from ``q_floor`` to $10^3 \max|v|$,
    ``sweeps`` rounds of coordinate descent over the atoms (one for a single atom); the bias is measured on
    the sample's pre-activations (on a uniform grid of ``interval`` when one is given). Centers $p = 0$ (they
    do not change $\mathbb E\, y$, `ralimp.discretized`).
    """
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
    atoms, rho_c, rho_s = _gauge(w_c, w_s, torch.zeros_like(q), q, nodes)
    fit = DiscretizedFit(coef[:k1], atoms, rho_c, rho_s, interval or cal.fit_range)
    fit.max_error, fit.rms_error = fit.errors(fn)
    return fit


@FITS.register("discretized")
def least_squares_fit(
    fn: Callable[[torch.Tensor], torch.Tensor],
    cal: Calibration,
    sizes: Sizes,
    *,
    interval: tuple[float, float] | None = None,
    q_floor: float = 0.05,
) -> DiscretizedFit:
    """`ralimp.fit_discretized` on the fit range (or ``interval``), widths >= ``q_floor`` in $v$ units."""
    return fit_discretized(
        fn,
        interval or cal.fit_range,
        poly_degree=sizes.poly_degree,
        num_atoms=sizes.num_atoms,
        num_freqs=sizes.num_freqs,
        q_floor=q_floor * cal.tau**2,
    )


@FITS.register("paper")
def paper_fit(
    fn: Callable[[torch.Tensor], torch.Tensor],
    cal: Calibration,
    sizes: Sizes,
    *,
    interval: tuple[float, float] | None = None,
    q_floor: float = 0.05,
) -> DiscretizedFit:
    r"""The paper's initialization: the continuous fit on the fit range, node $k$ weighted by $\gamma_k$."""
    continuous = fit_rational(
        fn,
        interval or cal.fit_range,
        num_atoms=sizes.num_atoms,
        poly_degree=sizes.poly_degree,
        q_floor=q_floor * cal.tau**2,
    )
    return nodewise_quadrature(continuous, max(sizes.num_freqs, 1))


def dilated(rational: RationalFunction | DiscretizedFit, tau: float) -> RationalFunction | DiscretizedFit:
    r"""``rational`` with its atoms in $v = t / \tau^2$ rewritten in $t$ units: $a(t / \tau^2)$ (App. C.1).

    $(A, B, p, q) \to (A \tau^4, B \tau^2, p \tau^2, q \tau^2)$; the polynomial is unchanged.
    """
    t2 = tau**2
    atoms = torch.tensor(rational.atoms, dtype=torch.float64).reshape(-1, 4) * torch.tensor(
        [t2**2, t2, t2, t2], dtype=torch.float64
    )
    if isinstance(rational, DiscretizedFit):
        return DiscretizedFit(rational.poly, atoms, rational.node_cos, rational.node_sin, rational.interval)
    return RationalFunction(rational.poly, atoms, rational.interval)
