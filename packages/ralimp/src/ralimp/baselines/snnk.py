r"""SNNK (Sehanobish et al. 2024): scalable neural network kernel layers, Fourier and ReLU variants."""

from __future__ import annotations

import math
from typing import Any

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

    ``variant="fourier"`` (default), the paper's universal random features:
    $f(x \cdot w + b) \approx \operatorname{Re} \sum_r A_r \phi_r(x) \phi_r(w) e^{i \xi_r b}$ with
    $\phi_r(u) = \exp(a_r g_r \cdot u - a_r^2 \lVert u\rVert^2 / 2)$, $g_r$ the rows of $G$ and the complex
    $a_r = (1 + i) \sqrt{\xi_r / 2}$ ($a_r^2 = i \xi_r$), so that
    $\mathbb E[\phi_r(x) \phi_r(w)] = e^{i \xi_r\, x \cdot w}$; the bias is the exact phase $e^{i \xi_r b}$ of
    $\Psi$, as in the paper. The frequencies come from the activation's Fourier representation
    $f(t) \approx \operatorname{Re} \sum_j F_j e^{i \xi_j t}$ on ``interval``
    (`fourier_representation`): $\xi_r = \xi_j$ with probability $p_j = |F_j| / \sum |F|$ and weight
    $A_r = F_j / (m p_j)$, unbiased for the series at $t = x \cdot w + b$. Real features
    $[\operatorname{Re} \phi(x), \operatorname{Im} \phi(x)]$, $\Psi$ initialized as
    $[\operatorname{Re} V, -\operatorname{Im} V]$ with $V_r = A_r \phi_r(w) e^{i \xi_r b}$. The variance of a
    draw grows like $(\sum |F|)^2 e^{\xi_r \lVert x + w\rVert^2}$. As in RaLiMP, ``balance`` evaluates the
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
            $\lambda^2 = \operatorname{RMS} \lVert x\rVert / \operatorname{RMS} \lVert w\rVert$
            on the ``sample`` of ``from_linear`` (a departure).
        bias: fold a bias in.
        weight_matrix: ``rf_matrices`` name of ``G``.
        seed: seed of ``G`` and of the frequency draw.
        interval: interval of the Fourier series.
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
            weight_matrix,
            num_features,
            in_features + (variant == "relu"),  # the ReLU variant acts on [x; 1]
            seed=matrix_seed,
            even_in_omega=False,
            **factory,
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
        r"""$(\xi_j, F_j)$, ``(num_terms,)`` each: $f(t) \approx \operatorname{Re} \sum_j F_j e^{i \xi_j t}$.

        The half-range cosine series of $f$ on ``interval`` $[a, b]$,
        $f(t) \approx \sum_j c_j \cos(\xi_j (t - a))$ with $\xi_j = j \pi / (b - a)$, so
        $F_j = c_j e^{-i \xi_j a}$ ($c_j$ by least squares on 2001 points). It is the Fourier series of $f$
        reflected across $a$ and $b$, a continuous periodic function: its coefficients decay and do not cancel
        ($\sum |F| = 1.55$ for tanh on $[-4, 4]$), and $\sum |F|$ is the weight every random feature carries.
        """
        a, b = interval
        t = torch.linspace(a, b, 2001, dtype=torch.float64)
        xi = math.pi * torch.arange(num_terms, dtype=torch.float64) / (b - a)
        basis = torch.cos((t[:, None] - a) * xi)
        coef = torch.linalg.lstsq(basis, fn(t).unsqueeze(-1)).solution.squeeze(-1)
        return xi, coef * torch.exp(-1j * a * xi)

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

    def _fourier_features(self, u: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``(Re phi(u), Im phi(u))``, each ``(..., m)``."""
        return complex_exponential_features(u, self.matrix.matrix().to(dtype), self.freqs.to(dtype))

    def _relu_features(self, u: torch.Tensor) -> torch.Tensor:
        """``relu(G u) / sqrt(m)``, ``(..., m)``."""
        g = self.matrix.matrix().to(u.dtype)
        return torch.relu(u @ g.mT) / math.sqrt(g.shape[0])

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        r"""$[\operatorname{Re} \phi(x / \lambda), \operatorname{Im} \phi(x / \lambda)]$, ``(..., 2 m)``.

        The ReLU variant: $\max(G [x; 1], 0) / \sqrt m$, ``(..., m)``.
        """
        check_input(x, self.in_features)
        dtype = work_dtype(x.dtype)
        x = x.to(dtype)
        if self.variant == "relu":
            return self._relu_features(augmented(x))
        re, im = self._fourier_features(x / self.scale.to(dtype), dtype)
        return torch.cat([re, im], -1)

    @torch.no_grad()
    def load_linear(
        self, weight: torch.Tensor, bias: torch.Tensor | None, *, sample: torch.Tensor | None = None
    ) -> None:
        r"""$\Psi = [\operatorname{Re} V, -\operatorname{Im} V]$, $V_r = A_r \phi_r(\lambda w) e^{i \xi_r b}$.

        The ReLU variant: $\Psi = \phi([w; b])$. ``sample`` calibrates ``balance="auto"``.
        """
        dtype = torch.float64
        w = weight.to(dtype)
        b = torch.zeros_like(w[:, :1]) if bias is None else bias.to(dtype).unsqueeze(-1)
        if self.variant == "relu":
            self.psi_weight.copy_(self._relu_features(torch.cat([w, b], -1)))
            return
        lam = (
            auto_balance(weight, bias, sample, augmented=False)
            if self.balance_option == "auto"
            else float(self.balance_option)
        )
        self.scale.fill_(lam)
        re, im = self._fourier_features(w * lam, dtype)
        freqs = self.freqs.to(w)
        value = torch.complex(re, im) * self._amplitude.to(w.device) * torch.exp(1j * b * freqs)
        self.psi_weight.copy_(torch.cat([value.real, -value.imag], -1))
