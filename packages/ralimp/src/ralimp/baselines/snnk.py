r"""SNNK (Sehanobish et al. 2024): scalable neural network kernel layers, Fourier and ReLU variants."""

from __future__ import annotations

import math
from typing import Any, cast

import torch

import rf_matrices
from ralimp.base import (
    Elementwise,
    ReadoutLinearization,
    augmented,
    check_input,
    seeds,
    work_dtype,
)
from ralimp.budget import check_budget, check_count, exact_share, refuse_fixed
from ralimp.calibration import auto_balance, check_scale
from ralimp.features import complex_exponential_features
from ralimp.rational import DEFAULT_INTERVAL


class SNNK(ReadoutLinearization):
    r"""Scalable neural network kernel layer (Sehanobish et al. 2024) with a trainable $\Psi$.

    ``variant="fourier"`` (default): $\phi(u)_r = \exp(a_r g_r \cdot u - a_r^2 \lVert u\rVert^2 / 2)$ with the
    complex $a_r = (1 + i) \sqrt{\xi_r / 2}$ (so $a_r^2 = i \xi_r$), which gives
    $\mathbb E[\phi_r(x) \phi_r(w)] = \exp(i \xi_r\, x \cdot w)$; the frequencies $\xi_r$ are drawn from the
    activation's Fourier representation $f(t) \approx \operatorname{Re} \sum_j F_j \exp(i \xi_j t)$ (a
    least-squares cosine/sine series on ``interval`` with period $4 T$), with probability
    $|F_j| / \sum |F|$ and weight $A_r = F_j / (m p_j)$, so that
    $\operatorname{Re} \sum_r A_r \phi_r(x) \phi_r(w)$ is unbiased for the series at $t = x \cdot w + b$.
    Real features $[\operatorname{Re} \phi(x), \operatorname{Im} \phi(x)]$; $\Psi$ is initialized as
    $[\operatorname{Re}(A \phi(w)), -\operatorname{Im}(A \phi(w))]$. As in RaLiMP, ``balance`` evaluates the
    features at $x / \lambda$ and $\lambda w$.

    ``variant="relu"``: SNNK's ReLU variant $\phi(u) = \operatorname{relu}(G u) / \sqrt m$ on $u = [x; 1]$,
    $\Psi$ initialized as $\phi([w; b])$: this estimates the arc-cosine kernel of $(x, w)$, not
    $\operatorname{relu}(x \cdot w)$.

    Args:
        in_features: ``d``.
        out_features: ``l``.
        activation: registered name or elementwise callable.
        num_features: ``m``.
        variant: ``"fourier"`` or ``"relu"``.
        num_terms: terms of the Fourier series.
        balance: $\lambda$ (1, the default, is the plain estimator) or ``"auto"``:
            $\lambda^2 = \operatorname{RMS} \lVert[x; 1]\rVert / \operatorname{RMS} \lVert[w; b]\rVert$
            on the ``sample`` of ``from_linear`` (a departure).
        bias: fold a bias in.
        weight_matrix: ``rf_matrices`` name of ``G``.
        seed: seed of ``G`` and of the frequency draw.
        interval: interval of the Fourier fit.
        device: where parameters live.
        dtype: parameter dtype.
    """

    # buffers (``register_buffer``)
    scale: torch.Tensor
    freqs: torch.Tensor

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        activation: str | Elementwise = "gelu",
        num_features: int = 32,
        variant: str = "fourier",
        num_terms: int = 12,
        balance: float | str = 1.0,
        bias: bool = True,
        weight_matrix: str | type = "base",
        seed: int | None = None,
        interval: tuple[float, float] = DEFAULT_INTERVAL,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if variant not in ("fourier", "relu"):
            raise ValueError(f"variant: expected 'fourier' or 'relu', got {variant!r}")
        factory = self.set_up(in_features, out_features, activation, device, dtype)
        check_scale("balance", balance)
        self.variant, self.balance_option = variant, balance
        matrix_seed, draw_seed = seeds(seed, 2)
        self.matrix = rf_matrices.create(  # exp(a g . u) and relu(g . u) are not even in g
            weight_matrix, num_features, in_features + 1, seed=matrix_seed, even_in_omega=False, **factory
        )
        m = self.matrix.num_features
        self.register_buffer("scale", torch.ones((), **factory))
        if variant == "fourier":
            freqs, amplitudes = self.fourier_representation(self.fn, interval, num_terms)
            prob = amplitudes.abs() / amplitudes.abs().sum()
            index = torch.multinomial(
                prob, m, replacement=True, generator=torch.Generator().manual_seed(draw_seed)
            )
            self.register_buffer("freqs", freqs[index].to(**factory))
            self._amplitude = amplitudes[index] / (m * prob[index])  # complex, float64
        self.init_readout(2 * m if variant == "fourier" else m, bias, factory)

    @staticmethod
    def fourier_representation(
        fn: Elementwise, interval: tuple[float, float], num_terms: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""$(\xi_j, F_j)$ with $f(t) \approx \operatorname{Re} \sum_j F_j \exp(i \xi_j t)$ on ``interval``.

        $\xi_j = 2 \pi j / (4 T)$ with $T$ the interval's half-width.

        $F_j = \alpha_j - i \beta_j$ from the least-squares fit
        $f \approx \sum_j \alpha_j \cos + \beta_j \sin$.
        """
        a, b = interval
        half = max(abs(a), abs(b))
        t = torch.linspace(a, b, 2001, dtype=torch.float64)
        xi = 2 * math.pi * torch.arange(num_terms, dtype=torch.float64) / (4 * half)
        basis = torch.cat([torch.cos(t[:, None] * xi), torch.sin(t[:, None] * xi[1:])], -1)
        coef = torch.linalg.lstsq(basis, fn(t).unsqueeze(-1)).solution.squeeze(-1)
        beta = torch.cat([torch.zeros(1, dtype=torch.float64), coef[num_terms:]])
        return xi, torch.complex(coef[:num_terms], -beta)

    @property
    def num_random_features(self) -> int:
        """``m``, the projections (``2 m`` real features for the Fourier variant)."""
        return self.matrix.num_features

    @classmethod
    def budget_options(
        cls, budget: int | None, activation: object = None, *, count: str = "paper", **overrides: Any
    ) -> dict[str, int]:
        """``num_features``: $m = B$ (``count="paper"``), or $2 m = B$ (``"width"``)."""
        budget, count = check_budget(budget), check_count(count)
        refuse_fixed("num_features", overrides)
        if count == "paper" or overrides.get("variant", "fourier") == "relu":
            return {"num_features": budget}
        return {"num_features": exact_share(budget, 2, "[Re phi, Im phi]", budget)}

    def _features(
        self, u: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
        g = self.matrix.matrix().to(dtype)
        if self.variant == "relu":
            return torch.relu(u @ g.mT) / math.sqrt(g.shape[0])
        return complex_exponential_features(u, g, self.freqs.to(dtype))

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        r"""$[\operatorname{Re} \phi(x), \operatorname{Im} \phi(x)]$ (Fourier).

        The ReLU variant: $\max(G [x; 1], 0) / \sqrt m$.
        """
        check_input(x, self.in_features)
        dtype = work_dtype(x.dtype)
        u = augmented(x.to(dtype))
        if self.variant == "relu":
            return cast(torch.Tensor, self._features(u, dtype))  # relu: one tensor, not (re, im)
        re, im = self._features(u / self.scale.to(dtype), dtype)
        return torch.cat([re, im], -1)

    @torch.no_grad()
    def load_linear(
        self, weight: torch.Tensor, bias: torch.Tensor | None, *, sample: torch.Tensor | None = None
    ) -> None:
        r"""$\Psi = \phi([w; b])$ with the representation's weights folded in.

        ``sample`` calibrates ``balance="auto"``.
        """
        dtype = torch.float64
        b = torch.zeros_like(weight[:, :1]) if bias is None else bias.unsqueeze(-1)
        u = torch.cat([weight, b], -1).to(dtype)
        if self.variant == "relu":
            self.psi_weight.copy_(cast(torch.Tensor, self._features(u, dtype)))  # relu: one tensor
            return
        lam = (
            auto_balance(weight, bias, sample)
            if self.balance_option == "auto"
            else float(self.balance_option)
        )
        self.scale.fill_(lam)
        re, im = self._features(u * lam, dtype)
        amp = self._amplitude.to(u.device)
        value = torch.complex(re, im) * amp
        self.psi_weight.copy_(torch.cat([value.real, -value.imag], -1))
