r"""EUGen (Kim et al. 2025): polynomial-only product features with a trainable readout."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import rf_matrices
from ralimp.base import (
    Elementwise,
    ReadoutLinearization,
    augmented,
    check_input,
    seeds,
    weight_matrices,
    work_dtype,
)
from ralimp.budget import check_budget, check_count, exact_share, refuse_fixed
from ralimp.calibration import calibrate
from ralimp.features import product_features
from ralimp.rational import DEFAULT_INTERVAL, RationalFunction, activation_fit, fit_rational
from rf_matrices import WeightMatrix
from spectraformer_core import check_positive_int


class EUGen(ReadoutLinearization):
    r"""Polynomial-only product features with a trainable $\Psi$ (Kim et al. 2025).

    $\Phi(x) = [1, \phi_1(x^+), \dots, \phi_K(x^+)]$ on $x^+ = [x; 1; \lVert x\rVert]$
    ([`ralimp.product_features`][ralimp.product_features]), $\Psi$ a trainable ``(out, 1 + K m)`` matrix
    initialized as $[c_0, c_n \phi_n(w^+) / m]$ with $w^+ = [w; b; 0]$ and $c$ the least-squares polynomial
    fit of the activation, so the layer starts as an unbiased estimate of $P(w \cdot x + b)$. The fit is made
    on ``interval`` when one is given, else on the calibration range of the pre-activations when
    `load_linear` (or ``from_linear``) gets a ``sample`` (`ralimp.calibration.Calibration.fit_range`, as
    RaLiMP's), else on $[-4, 4]$.
    The $\lVert x\rVert$ coordinate is EUGen's augmentation; it enters at initialization with weight 0 and is
    available to training.

    Args:
        in_features: ``d``.
        out_features: ``l``.
        activation: registered name or elementwise callable.
        poly_degree: ``K``.
        num_features: ``m`` rows per projection.
        bias: fold a bias in.
        weight_matrix: ``rf_matrices`` name of the projections.
        seed: seed of the projections.
        interval: interval of the polynomial fit (None: the sample's range, $[-4, 4]$ without a sample).
        device: where parameters live.
        dtype: parameter dtype.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        activation: str | Elementwise = "gelu",
        poly_degree: int = 2,
        num_features: int = 32,
        bias: bool = True,
        weight_matrix: str | type = "base",
        seed: int | None = None,
        interval: tuple[float, float] | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        factory = self.set_up(in_features, out_features, activation, device, dtype)
        self.poly_degree = check_positive_int("poly_degree", poly_degree)
        self.interval = None if interval is None else (float(interval[0]), float(interval[1]))
        self.fit = self._polynomial_fit(self.interval or DEFAULT_INTERVAL)
        self.matrices: Sequence[WeightMatrix] = weight_matrices(
            rf_matrices.create(
                weight_matrix, num_features, in_features + 2, seed=s, even_in_omega=True, **factory
            )
            for s in seeds(seed, poly_degree)
        )
        self.init_readout(1 + sum(m.num_features for m in self.matrices), bias, factory)

    def _polynomial_fit(self, interval: tuple[float, float]) -> RationalFunction:
        """The least-squares polynomial of degree $K$ of the activation on ``interval``."""
        if self.activation_name is not None:
            return activation_fit(
                self.activation_name, poly_degree=self.poly_degree, num_atoms=0, interval=interval
            )
        return fit_rational(self.fn, interval, num_atoms=0, poly_degree=self.poly_degree)

    @property
    def num_random_features(self) -> int:
        """``m``, the rows of one projection (the paper's count)."""
        return self.matrices[0].num_features

    def fit_record(self) -> dict[str, object]:
        """`FeatureLinearization.fit_record` plus the polynomial's fit range."""
        return {**super().fit_record(), "fit_range": [round(v, 6) for v in self.fit.interval]}

    @classmethod
    def budget_options(
        cls, budget: int | None, activation: object = None, *, count: str = "paper", **overrides: Any
    ) -> dict[str, int]:
        """``num_features``: $m = B$ (``count="paper"``) or $1 + K m = B$ (``"width"``)."""
        budget, count = check_budget(budget), check_count(count)
        refuse_fixed("num_features", overrides)
        if count == "paper":
            return {"num_features": budget}
        return {
            "num_features": exact_share(budget - 1, overrides.get("poly_degree", 2), "the products", budget)
        }

    def _plus(self, u: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
        return torch.cat([u, norm], -1)

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        r"""$[1, \phi_1(x^+), \dots, \phi_K(x^+)]$, ``(..., 1 + K m)``."""
        check_input(x, self.in_features)
        dtype = work_dtype(x.dtype)
        x = x.to(dtype)
        u = self._plus(augmented(x), x.norm(dim=-1, keepdim=True))
        mats = [m.matrix().to(dtype) for m in self.matrices]
        return torch.cat([torch.ones_like(u[..., :1]), *product_features(u, mats)], -1)

    @torch.no_grad()
    def load_linear(
        self, weight: torch.Tensor, bias: torch.Tensor | None, *, sample: torch.Tensor | None = None
    ) -> None:
        r"""$\Psi = [c_0, c_n \phi_n([w; b; 0]) / m]$; with a ``sample`` (and no ``interval``) refitted first.

        The polynomial is refitted on the range of $[x; 1] \cdot [w; b]$ over the sample
        (`ralimp.calibration.Calibration.fit_range`).
        """
        if sample is not None and self.interval is None:
            cal = calibrate(weight, bias, sample, tau=1.0, balance=1.0)
            self.fit = self._polynomial_fit(cal.fit_range)
        dtype = torch.float64
        w = weight.to(dtype)
        b = torch.zeros_like(w[:, :1]) if bias is None else bias.to(dtype).unsqueeze(-1)
        u = torch.cat([w, b, torch.zeros_like(b)], -1)
        coef = self.fit.poly
        mats = [m.matrix().to(dtype) for m in self.matrices]
        parts = [torch.full_like(b, coef[0])]
        for n, phi in enumerate(product_features(u, mats), start=1):
            parts.append(phi * (coef[n] / phi.shape[-1]))
        self.psi_weight.copy_(torch.cat(parts, -1))
