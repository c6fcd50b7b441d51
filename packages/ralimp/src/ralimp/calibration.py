r"""The calibration sample of a layer: its pre-activation pairs and the scales $\tau$, $\lambda$ (App. C.1).

A layer is fitted on the pre-activations its calibration sample really has: `calibrate` pairs every input
$x$ of the sample with every weight row $w$ (both subsampled) and keeps, per pair, $t = [x; 1] \cdot [w; b]$,
$\lVert[x; 1]\rVert^2$ and $\lVert[w; b]\rVert^2$. Without a sample the inputs are standard normal
(seeded draws), the assumption of the layer's documentation. The fit range is the robust quantile range of
$t$ (`Calibration.fit_range`).

The atoms live in the dilated variable $v = t / \tau^2$ (App. C.1: the rational features evaluated at
$u / \tau$ estimate $\cos(s_k t / \tau^2)$), with $\tau^2 = c \operatorname{RMS}(t)$ so that $v = O(1)$
(`layer_scales`). The balance $\lambda$ evaluates the features at $[x; 1] / \lambda$ and $\lambda [w; b]$;
``"auto"`` is `auto_balance`, shared by RaLiMP and SNNK. The covariances of the estimators averaged over the
pairs (`Calibration.node_covariance`, `Calibration.poly_covariance`) are `ralimp.moments` at these pairs.
The fit modes that use them are `ralimp.fits`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ralimp.moments import node_covariance, product_covariance

#: Lower and upper quantile of the pre-activations that bound the fit range.
RANGE_QUANTILE = 1e-3

#: The most entries of one temporary tensor in the vectorized moments and fits (16 MiB in float64): work over
#: many frequencies or candidate widths goes in chunks of this size.
CHUNK_ELEMENTS = 2**21


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

    def node_covariance(self, freq: torch.Tensor, rows: int) -> torch.Tensor:
        r"""Covariance of the estimators $(C, S)$ of $(\cos(a t), \sin(a t))$ over the pairs, ``(n, 2, 2)``.

        Prop. 1 with the cross moment (`ralimp.moments.node_covariance`) at the frequencies $a$ = ``freq``
        ``(n,)`` (in $t$ units: $a = s_k / q$), features at $[x; 1] / \lambda$ and $\lambda [w; b]$,
        ``rows`` i.i.d. $\mathcal N(0, I)$ projections. The exponent $2\sigma^2$ is capped at 700 (float64),
        where the variance is astronomically large anyway.
        """
        lam2 = self.balance**2
        x_sq, w_sq = self.x_sq / lam2, lam2 * self.w_sq
        means = []  # (3, n): the frequencies in chunks of at most CHUNK_ELEMENTS (frequency, pair) entries
        for part in freq.to(self.t).split(max(1, CHUNK_ELEMENTS // max(self.t.numel(), 1))):
            moments = node_covariance(part.unsqueeze(-1), self.t, x_sq, w_sq, max_sigma2=350)
            means.append(torch.stack([m.mean(-1) for m in moments]))
        cc, ss, cs = torch.cat(means, -1) if means else torch.zeros(3, 0, dtype=self.t.dtype)
        return torch.stack([torch.stack([cc, cs], -1), torch.stack([cs, ss], -1)], -2) / rows

    def poly_covariance(self, poly_degree: int, rows: int) -> torch.Tensor:
        r"""Covariance of the product-feature estimators of $t^0..t^K$, mean over the pairs, ``(K+1, K+1)``.

        Prop. 2 with shared projections (`ralimp.moments.product_covariance`), ``rows`` projections; $t^0$
        is exact.
        """
        entries = product_covariance(self.t, self.x_sq, self.w_sq, poly_degree)
        cov = torch.zeros(poly_degree + 1, poly_degree + 1, dtype=self.t.dtype)
        for n in range(1, poly_degree + 1):
            for k in range(1, poly_degree + 1):
                cov[n, k] = entries[n][k].mean() / rows
        return cov


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


def rms_preactivation(weight: torch.Tensor, bias: torch.Tensor | None, sample: torch.Tensor | None) -> float:
    r"""RMS of $t = x \cdot w + b$.

    Over ``sample`` if given, else for standard-normal inputs ($\mathbb E t^2 = \lVert w\rVert^2 + b^2$,
    averaged over rows).
    """
    w = weight.detach().to(torch.float64)
    b = torch.zeros(w.shape[0], dtype=torch.float64, device=w.device) if bias is None else bias.detach()
    if sample is not None:
        x = sample.detach().reshape(-1, w.shape[1]).to(w)
        return float((x @ w.mT + b.to(w)).pow(2).mean().sqrt())
    return float((w.pow(2).sum(-1) + b.to(w).pow(2)).mean().sqrt())


def rms_input_norm(dim: int, sample: torch.Tensor | None, *, augmented: bool = True) -> float:
    r"""RMS of $\lVert[x; 1]\rVert$ over ``sample``, else $\sqrt{\mathrm{dim} + 1}$ (standard normal).

    ``augmented=False``: of $\lVert x\rVert$ (else $\sqrt{\mathrm{dim}}$).
    """
    one = 1 if augmented else 0
    if sample is None:
        return math.sqrt(dim + one)
    x = sample.detach().reshape(-1, dim).to(torch.float64)
    return float((x.pow(2).sum(-1) + one).mean().sqrt())


def auto_balance(
    weight: torch.Tensor, bias: torch.Tensor | None, sample: torch.Tensor | None, *, augmented: bool = True
) -> float:
    r"""$\lambda$ of ``balance="auto"``, shared by RaLiMP and SNNK (a departure from the papers).

    $\lambda^2 = \operatorname{RMS} \lVert[x; 1]\rVert / \operatorname{RMS} \lVert[w; b]\rVert$, or
    $\operatorname{RMS} \lVert x\rVert / \operatorname{RMS} \lVert w\rVert$ with ``augmented=False`` (features
    of $x$ and $w$ alone: SNNK's, whose bias is a phase of $\Psi$).

    It minimizes $\mathbb E \lVert x/\lambda + \lambda w\rVert^2$, the exponent of the complex-exponential
    estimators' variance (Prop. 1); ``sample`` None: standard-normal inputs.
    """
    b2 = 0 if bias is None or not augmented else bias.double() ** 2
    w_norm = float((weight.double().pow(2).sum(-1) + b2).mean())
    return (rms_input_norm(weight.shape[1], sample, augmented=augmented) / max(w_norm**0.5, 1e-12)) ** 0.5


def check_scale(name: str, value: object) -> None:
    """Raise a ``ValueError`` unless ``value`` is ``"auto"`` or a positive number (``tau``, ``balance``)."""
    if not (value == "auto" or (isinstance(value, int | float) and value > 0)):
        raise ValueError(f"{name}: expected 'auto' or a positive number, got {value!r}")


def layer_scales(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    sample: torch.Tensor | None,
    *,
    tau: float | str,
    tau_c: float,
    balance: float | str,
) -> tuple[float, float]:
    r"""$(\tau, \lambda)$: $\tau^2 = c \operatorname{RMS}(t)$ for ``"auto"`` (App. C.1), and the balance."""
    rms_t = rms_preactivation(weight, bias, sample)
    tau_value = (tau_c * rms_t) ** 0.5 if tau == "auto" else float(tau)
    lam = auto_balance(weight, bias, sample) if balance == "auto" else float(balance)
    return max(tau_value, 1e-6), lam
