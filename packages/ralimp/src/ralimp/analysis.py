r"""Exact variances of the unbiased layers over their random projections, per layer (Prop. 1, Prop. 2).

The complex-exponential estimator is log-normal: its second moment is $e^{2\sigma^2}$ with
$2\sigma^2 = s \lVert\tilde x + \tilde w\rVert^2$, so a sample of a few thousand draws sees almost none of its
mass once $2\sigma^2$ exceeds ~6, and sampled MSEs underestimate the variance by many orders of magnitude.
These closed forms (`ralimp.moments`) replace sampled figures. All of them assume i.i.d. $\mathcal N(0, I)$
projection rows (``weight_matrix="base"``, $\sigma = 1$); orthogonal or quadrature rows have other variances.

Lower bound (the guide's): with $\lambda$ free,
$\lVert x/\lambda + \lambda w\rVert^2 \ge 2 \lVert x\rVert \lVert w\rVert + 2 t$, so

$$\log \mathbb E|Y_k|^2 = 2\sigma_k^2 \ge 2 s_k |u| \left(\frac{1}{|\cos\theta|} - 1\right)$$

with $u = t / q$ and $\theta$ the angle between $[x; 1]$ and $[w; b]$ (`log_second_moment_bound`).

What an atom costs and buys in a built layer (`atom_tradeoff`, `atoms_table`): its fits with $J = 0$ and
$J = 1$ at its budget, each split into the squared bias of the expectation and the exact variance over the
projections; `relative_spread` measures any replacement's error at a layer's inputs by Monte Carlo.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from ralimp.baselines import EUGen
from ralimp.discretized import DiscretizedFit
from ralimp.fits import FITS, Sizes, expected_squared_error
from ralimp.layer import RaLiMP
from ralimp.moments import node_covariance, node_log_growth, product_covariance
from ralimp.rational import RationalFunction
from ralimp.replace import create
from rf_matrices import Base
from spectraformer_core import markdown_table

#: The fit modes `atom_tradeoff` compares: RaLiMP's default and the two that fit the bias alone.
MODES = ("variance", "discretized", "paper")


def _pair_terms(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(t, x_sq, w_sq)`` of every input ``(N, D)`` with every weight row ``(L, D)``, ``(N, L)`` float64."""
    x, w = x.to(torch.float64), w.to(torch.float64)
    return x @ w.mT, x.pow(2).sum(-1, keepdim=True), w.pow(2).sum(-1).unsqueeze(0)


def node_log_variance(
    x: torch.Tensor,
    w: torch.Tensor,
    freq: torch.Tensor | float,
    w_c: torch.Tensor | float,
    w_s: torch.Tensor | float,
    rows: int,
) -> torch.Tensor:
    r"""$\log \operatorname{Var}(w_c C + w_s S)$ for every input and weight row, ``(N, L)``, float64.

    ``C`` and ``S`` average ``rows`` i.i.d. projections of the estimators of $\cos(s\, x \cdot w)$ and
    $\sin(s\, x \cdot w)$ at frequency ``freq`` (Eqs. 8-9, Prop. 1 with the cross moment,
    `ralimp.moments.node_covariance`; features evaluated at ``x`` ``(N, D)`` and ``w`` ``(L, D)`` as given,
    already scaled). Computed in log space, $e^{2\sigma^2}$ factored out: the variance overflows float64 at
    $2\sigma^2 > 709$.
    """
    t, x_sq, w_sq = _pair_terms(x, w)
    s, a, b = float(freq), float(w_c), float(w_s)
    log_growth = node_log_growth(s, t, x_sq, w_sq)
    cc, ss, cs = node_covariance(s, t, x_sq, w_sq, log_scale=log_growth)
    inner = a**2 * cc + b**2 * ss + 2 * a * b * cs
    return log_growth + torch.log(inner.clamp_min(0)) - math.log(rows)


def product_block_variance(coef: torch.Tensor, x: torch.Tensor, w: torch.Tensor, rows: int) -> torch.Tensor:
    r"""Variance of $\sum_{n \ge 1} c_n \frac1m \langle\phi_n(x), \phi_n(w)\rangle$, ``(N, L)``.

    EUGen, shared projections (Prop. 2, `ralimp.moments.product_covariance`).

    Args:
        coef: ``c_0..c_K`` (``c_0`` is deterministic and ignored).
        x: ``(N, D)`` inputs as the block sees them (augmented).
        w: ``(L, D)`` weight rows as the block sees them.
        rows: ``m``, the rows of each projection.
    """
    c = torch.as_tensor(coef, dtype=torch.float64)
    cov = product_covariance(*_pair_terms(x, w), c.numel() - 1)
    total = sum(c[n] * c[k] * entry for n, row in enumerate(cov) for k, entry in enumerate(row))
    return torch.as_tensor(total).clamp_min(0) / rows


def check_gaussian_rows(matrices: Iterable[torch.nn.Module]) -> None:
    r"""Raise a ``ValueError`` unless every projection matrix has i.i.d. $\mathcal N(0, I)$ rows."""
    for m in matrices:
        if type(m) is not Base or m.sigma != 1.0:
            raise ValueError(
                f"weight_matrix: the closed forms assume i.i.d. N(0, I) rows ('base', sigma=1), got "
                f"{type(m).__name__} with sigma={getattr(m, 'sigma', None)}"
            )


@torch.no_grad()
def ralimp_log_variance(layer: RaLiMP, x: torch.Tensor) -> torch.Tensor:
    r"""$\log \operatorname{Var} y$ of a `ralimp.RaLiMP` with its $\Psi(W)$ readout, ``(N, l)``.

    Exact: the polynomial block (Prop. 2, shared projections) plus every node of every atom (Prop. 1 with the
    cross moment), independent blocks; at the layer's current ``W, b``, poles, node coefficients, ``tau`` and
    balance. ``x`` is ``(N, in_features)``.
    """
    if layer.readout is not None:
        raise ValueError("layer: has a fitted readout (init='lstsq'); its output is not Psi(W) Phi(x)")
    check_gaussian_rows([*layer.poly_matrices, *layer.freq_matrices])
    u = torch.cat([x.to(torch.float64), torch.ones_like(x[..., :1], dtype=torch.float64)], -1)
    b = torch.zeros_like(layer.weight[:, 0]) if layer.bias is None else layer.bias
    v = torch.cat([layer.weight, b.unsqueeze(-1)], -1).to(torch.float64)
    logs = []
    if layer.poly_degree:
        rows = layer.poly_matrices[0].num_features
        logs.append(product_block_variance(layer.poly_coef.double(), u, v, rows).log())
    if layer.num_atoms:
        scale, tau = float(layer.scale), float(layer.tau)
        xs, ws = u / (scale * tau), v * (scale / tau)
        w_c, w_s = layer.node_coefficients(torch.float64)
        q = layer.pole_widths().double()
        for index, mat in enumerate(layer.freq_matrices):
            j, k = divmod(index, layer.num_freqs)
            freq = layer.nodes[k].double() / q[j]
            logs.append(node_log_variance(xs, ws, freq, w_c[j, k], w_s[j, k], mat.num_features))
    return torch.logsumexp(torch.stack(logs), 0)


@torch.no_grad()
def eugen_variance(layer: EUGen, linear: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    r"""$\operatorname{Var} y$ of a `ralimp.EUGen` at its $\Psi(W)$ init from ``linear``, ``(N, l)``.

    The block sees $x^+ = [x; 1; \lVert x\rVert]$ and $w^+ = [w; b; 0]$ (EUGen's augmentation).
    """
    check_gaussian_rows(layer.matrices)
    x = x.to(torch.float64)
    u = torch.cat([x, torch.ones_like(x[..., :1]), x.norm(dim=-1, keepdim=True)], -1)
    w = linear.weight.detach().to(torch.float64)
    b = torch.zeros_like(w[:, 0]) if linear.bias is None else linear.bias.detach().to(torch.float64)
    v = torch.cat([w, b.unsqueeze(-1), torch.zeros_like(b).unsqueeze(-1)], -1)
    return product_block_variance(torch.tensor(layer.fit.poly), u, v, layer.num_random_features)


def expected_relative_mse(
    mean: torch.Tensor, log_variance: torch.Tensor, target: torch.Tensor, *, log: bool = False
) -> float:
    r"""$\mathbb E \lVert y - f\rVert^2 / \lVert f\rVert^2$ over the projections, a float.

    It is $(\lVert \mathbb E y - f\rVert^2 + \sum \operatorname{Var} y) / \lVert f\rVert^2$.

    ``mean`` is $\mathbb E y$, ``log_variance`` the log of $\operatorname{Var} y$ (both shaped as
    ``target``). ``log=True`` returns the natural log instead
    (the value itself overflows float64 beyond ``1e308``).
    """
    bias = (mean.double() - target.double()).pow(2).sum()
    energy = target.double().pow(2).sum()
    total = torch.logsumexp(torch.stack([bias.log(), torch.logsumexp(log_variance.double().flatten(), 0)]), 0)
    value = total - energy.log()
    return float(value) if log else float(torch.exp(value))


def log_second_moment_bound(
    node: torch.Tensor | float, t: torch.Tensor, q: float, cos_theta: torch.Tensor
) -> torch.Tensor:
    r"""$2 s_k |u| (1/|\cos\theta| - 1)$, $u = t / q$: lower bound on $\log \mathbb E|Y_k|^2$.

    It holds for any tau and balance. $\mathbb E|Y|^2 = \mathbb E[(Y^c)^2 + (Y^s)^2] = e^{2\sigma^2}$
    (Eq. 13) with
    $2\sigma^2 = (s_k / q') \lVert x / \lambda + \lambda w\rVert^2 / \tau^2$ and $q' \tau^2 = q$;
    $\lVert a / \lambda + \lambda b\rVert^2 \ge 2 \lVert a\rVert \lVert b\rVert + 2\, a \cdot b$ for every
    $\lambda$, and $\lVert a\rVert \lVert b\rVert = |t| / |\cos\theta|$ with $t = a \cdot b$. Rescaling the
    inputs ($x \to c x$, $W \to W / c$) leaves $t$ and $\theta$ unchanged.
    """
    u = torch.as_tensor(t, dtype=torch.float64).abs() / q
    return 2 * torch.as_tensor(node, dtype=torch.float64) * u * (1 / torch.as_tensor(cos_theta).abs() - 1)


def atom_tradeoff(layer: RaLiMP, *, freq_features: int | None = None) -> list[dict[str, Any]]:
    r"""Bias$^2$ and variance of ``layer``'s fits with 0 and 1 atom at its budget, a row per (atoms, mode).

    On the layer's calibration pairs (its sample, $\tau$, balance and fit range), with its $K$, nodes per
    atom and budget count, $J = 0$ and $J = 1$ spend the layer's budget (`RaLiMP.budget_options`); each is
    fitted in every mode of `MODES` (``"paper"`` only with the atom: without one it is the least-squares
    polynomial) and its expected squared error (`ralimp.fits.expected_squared_error`, i.i.d.
    $\mathcal N(0, I)$ rows) split into the mean squared bias of the layer's expectation and the mean
    variance of its output.

    Args:
        layer: a RaLiMP of an elementwise activation, as built (its own fit and $J$ do not matter).
        freq_features: projections per node with the atom; None: the layer's own, or ralimp's split
            (`RaLiMP.budget_options`) when it has no atom.

    Returns:
        Rows ``{"atoms", "fit", "bias2", "variance", "total", "signal"}``; ``signal`` is the mean of
        $f(t)^2$ on the pairs, for scale.
    """
    if isinstance(layer.target, RationalFunction | DiscretizedFit):
        raise ValueError("layer: expected a RaLiMP of an elementwise activation, not of a given rational fit")
    cal, fn, count = layer.calibration, layer.target, layer.options.budget_count
    budget = layer.num_random_features if count == "paper" else layer.feature_dim
    if freq_features is None and layer.num_atoms:
        freq_features = layer.freq_matrices[0].num_features
    target = fn(cal.t).double()
    signal = float(target.pow(2).mean())
    rows = []
    for atoms in (0, 1):
        shape = {"poly_degree": layer.poly_degree, "num_atoms": atoms, "num_freqs": layer.num_freqs}
        fixed = {"freq_features": freq_features} if atoms and freq_features is not None else {}
        sizes = Sizes.of(shape | RaLiMP.budget_options(budget, count=count, **shape, **fixed))
        for mode in MODES[: 3 if atoms else 2]:
            fit = FITS.get(mode)(fn, cal, sizes, dataclasses.replace(layer.options, fit=mode))
            bias2 = float((fit(cal.t) - target).pow(2).mean())
            total = expected_squared_error(fit, fn, cal, sizes)
            row = {"atoms": atoms, "fit": mode, "bias2": bias2, "variance": total - bias2, "total": total}
            rows.append(row | {"signal": signal})
    return rows


def ralimp_layers(model: nn.Module) -> list[tuple[str, RaLiMP]]:
    """``(module path, layer)`` of every RaLiMP of ``model``: the rows `atoms_table` takes."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, RaLiMP)]


#: The columns of `atoms_table`.
ATOM_COLUMNS = (
    "layer",
    "mean f(t)^2",
    "bias^2 without atom",
    "bias^2 removed by one atom",
    "variance added by it",
    "variance, paper's fit",
    "variance-aware bias^2 + variance, no atom / one atom",
    "atoms chosen",
)


def atoms_table(layers: Iterable[tuple[str, RaLiMP]], *, freq_features: int | None = None) -> str:
    r"""A Markdown table of `ATOM_COLUMNS`, a row per named layer: what one atom buys and costs there.

    From `atom_tradeoff`: the least-squares fits (``"discretized"``, bias alone) with and without the atom
    give the squared bias it removes and the variance it adds; the paper's fit with the atom gives the
    variance of the paper's layout; the variance-aware fit keeps the $J$ of the least bias$^2$ + variance
    (both given). Bias and variance are means over the layer's calibration pairs.
    """
    rows = []
    for name, layer in layers:
        found = {(r["atoms"], r["fit"]): r for r in atom_tradeoff(layer, freq_features=freq_features)}
        none, one = found[0, "discretized"], found[1, "discretized"]
        chosen = int(found[1, "variance"]["total"] < found[0, "variance"]["total"])
        added = one["variance"] - none["variance"]
        numbers = [
            none["signal"],
            none["bias2"],
            none["bias2"] - one["bias2"],
            added,
            found[1, "paper"]["variance"],
        ]
        totals = f"{found[0, 'variance']['total']:.2g} / {found[1, 'variance']['total']:.2g}"
        rows.append([name, *(f"{v:.2g}" for v in numbers), totals, str(chosen)])
    return markdown_table(list(ATOM_COLUMNS), rows)


def relative_spread(
    linear: nn.Linear,
    activation: str | Callable[[torch.Tensor], torch.Tensor],
    sample: torch.Tensor,
    kind: str,
    *,
    budget: int | None,
    seeds: int = 16,
    **options: Any,
) -> float:
    r"""$\sqrt{\operatorname{mean} (\hat y - y)^2 / \operatorname{mean} y^2}$: a ``kind`` layer at ``sample``.

    $y = f(\text{linear}(x))$, $\hat y$ the replacement's output (``create(kind, ..., seed=s)``) at
    initialization, the mean over the sample, the outputs and ``seeds`` draws of the projections: the
    estimator's relative root-mean-square error (bias and variance together), by Monte Carlo.
    """
    fn = create("dense", linear, activation, budget=None)
    with torch.no_grad():
        target = fn(sample)
        errors = [
            (
                create(kind, linear, activation, budget=budget, sample=sample, seed=s, **options)(sample)
                - target
            )
            .pow(2)
            .mean()
            for s in range(seeds)
        ]
    return float((torch.stack(errors).mean() / target.pow(2).mean()).sqrt())
