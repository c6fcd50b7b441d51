"""The baselines RaLiMP is compared with: EUGen, SNNK and a low-rank factorization.

All take the same constructor style as [`ralimp.RaLiMP`][ralimp.RaLiMP] (``in_features, out_features, *,
activation, ..., bias, weight_matrix, seed``) and ``from_linear(linear, activation, **kw)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import nn

import rf_matrices
from ralimp.base import (
    Elementwise,
    Factory,
    FeatureLinearization,
    augmented,
    check_init,
    check_input,
    resolve_activation,
    rms_input_norm,
    seeds,
    weight_matrices,
    work_dtype,
)
from ralimp.budget import BudgetError, check_budget, check_count, exact_share
from ralimp.calibration import calibrate
from ralimp.features import complex_exponential_features, product_features
from ralimp.rational import DEFAULT_INTERVAL, RationalFunction, activation_fit, fit_rational
from rf_matrices import WeightMatrix
from spectraformer_core import check_positive_int


def refuse_fixed(name: str, overrides: dict[str, Any]) -> None:
    """A `BudgetError` when ``overrides`` sets the size the budget decides."""
    if name in overrides:
        raise BudgetError(f"{name}: set by the budget, got {name}={overrides[name]!r} as well")


def _default_linear(
    out_features: int, in_features: int, bias: bool, factory: Factory
) -> tuple[torch.Tensor, torch.Tensor | None]:
    linear = nn.Linear(in_features, out_features, bias=bias, **factory)
    return linear.weight.detach(), None if linear.bias is None else linear.bias.detach()


class EUGen(FeatureLinearization):
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
        self.in_features = check_positive_int("in_features", in_features)
        self.out_features = check_positive_int("out_features", out_features)
        self.poly_degree = check_positive_int("poly_degree", poly_degree)
        factory: Factory = {"device": device, "dtype": dtype or torch.get_default_dtype()}
        self.activation_name, self.fn = resolve_activation(activation)
        self.interval = None if interval is None else (float(interval[0]), float(interval[1]))
        self.fit = self._polynomial_fit(self.interval or DEFAULT_INTERVAL)
        self.matrices: Sequence[WeightMatrix] = weight_matrices(
            rf_matrices.create(
                weight_matrix, num_features, in_features + 2, seed=s, even_in_omega=True, **factory
            )
            for s in seeds(seed, poly_degree)
        )
        width = 1 + sum(m.num_features for m in self.matrices)
        self.psi_weight = nn.Parameter(torch.zeros(out_features, width, **factory))
        self.load_linear(*_default_linear(out_features, in_features, bias, factory))

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

    def set_readout(self, psi: torch.Tensor) -> None:
        """Copy ``psi`` ``(out_features, 1 + K m)`` into the trainable ``Psi``."""
        self.psi_weight.copy_(psi)

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

    def weight_features(self) -> torch.Tensor:
        """The trainable ``Psi``."""
        return self.psi_weight

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


class SNNK(FeatureLinearization):
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
        self.in_features = check_positive_int("in_features", in_features)
        self.out_features = check_positive_int("out_features", out_features)
        if not (balance == "auto" or (isinstance(balance, int | float) and balance > 0)):
            raise ValueError(f"balance: expected 'auto' or a positive number, got {balance!r}")
        self.variant, self.balance_option = variant, balance
        factory: Factory = {"device": device, "dtype": dtype or torch.get_default_dtype()}
        self.activation_name, self.fn = resolve_activation(activation)
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
            width = 2 * m
        else:
            width = m
        self.psi_weight = nn.Parameter(torch.zeros(out_features, width, **factory))
        self.load_linear(*_default_linear(out_features, in_features, bias, factory))

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

    def set_readout(self, psi: torch.Tensor) -> None:
        """Copy ``psi`` ``(out_features, F)`` into the trainable ``Psi``."""
        self.psi_weight.copy_(psi)

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

    def weight_features(self) -> torch.Tensor:
        """The trainable ``Psi``."""
        return self.psi_weight

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
            (rms_input_norm(self.in_features, sample) / max(float(u.pow(2).sum(-1).mean()) ** 0.5, 1e-12))
            ** 0.5
            if self.balance_option == "auto"
            else float(self.balance_option)
        )
        self.scale.fill_(lam)
        re, im = self._features(u * lam, dtype)
        amp = self._amplitude.to(u.device)
        value = torch.complex(re, im) * amp
        self.psi_weight.copy_(torch.cat([value.real, -value.imag], -1))


class LowRank(nn.Module):
    """``activation(U (V x) + b)`` with ``W ~ U V`` of rank ``r`` (the truncated SVD of a pretrained ``W``).

    Args:
        in_features: ``d``.
        out_features: ``l``.
        activation: registered name or elementwise callable (applied exactly).
        rank: ``r``.
        bias: learn a bias.
        seed: seed of the random initialization (``from_linear`` overwrites it with the SVD factors).
        device: where parameters live.
        dtype: parameter dtype.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        activation: str | Elementwise = "gelu",
        rank: int = 32,
        bias: bool = True,
        seed: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.in_features = check_positive_int("in_features", in_features)
        self.out_features = check_positive_int("out_features", out_features)
        self.rank = check_positive_int("rank", rank)
        self.activation_name, self.fn = resolve_activation(activation)
        factory: Factory = {"device": device, "dtype": dtype}
        self.down = nn.Linear(in_features, rank, bias=False, **factory)
        self.up = nn.Linear(rank, out_features, bias=bias, **factory)
        if seed is not None:
            gen = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for linear in (self.down, self.up):
                    bound = 1 / math.sqrt(linear.in_features)
                    draw = torch.rand(linear.weight.shape, generator=gen, dtype=torch.float64)
                    linear.weight.copy_((2 * draw - 1) * bound)

    @property
    def num_random_features(self) -> int:
        """The rank (the budget the paper matches across methods)."""
        return self.rank

    @property
    def feature_dim(self) -> int:
        """The rank ``r``, the width between ``V`` and ``U``."""
        return self.rank

    @classmethod
    def budget_options(
        cls, budget: int | None, activation: object = None, *, count: str = "paper", **overrides: Any
    ) -> dict[str, int]:
        """``rank = B`` under both counting rules."""
        check_count(count)
        refuse_fixed("rank", overrides)
        return {"rank": check_budget(budget)}

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        activation: str | Elementwise = "gelu",
        *,
        sample: torch.Tensor | None = None,
        init: str = "psi",
        ridge: float = 1e-6,
        **kw: Any,
    ) -> LowRank:
        """``U V``: the rank-``r`` truncated SVD of ``linear.weight`` (Eckart-Young).

        ``init="psi"``: the plain SVD, best in Frobenius norm. ``init="lstsq"``: best in the least-squares
        sense on ``sample``, ``min ||(W - U V) x||^2`` over the sample (SVD of ``W L`` with ``L L^T`` the
        sample's second-moment matrix plus ``ridge`` times its mean eigenvalue).
        """
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"linear: expected an nn.Linear, got {type(linear).__name__}")
        check_init(init, sample)
        kw.setdefault("device", linear.weight.device)
        kw.setdefault("dtype", linear.weight.dtype)
        layer = cls(
            linear.in_features, linear.out_features, activation=activation, bias=linear.bias is not None, **kw
        )
        weight = linear.weight.detach().to(torch.float64)
        with torch.no_grad():
            if init == "lstsq":
                x = (
                    check_input(sample, linear.in_features)
                    .detach()
                    .reshape(-1, linear.in_features)
                    .to(weight)
                )
                second = x.mT @ x / x.shape[0]
                second.diagonal().add_(ridge * float(second.diagonal().mean()) + 1e-12)
                root = torch.linalg.cholesky(second)
                u, s, vh = torch.linalg.svd(weight @ root, full_matrices=False)
                vh = torch.linalg.solve_triangular(root, vh, upper=False, left=False)
            else:
                u, s, vh = torch.linalg.svd(weight, full_matrices=False)
            r = min(layer.rank, s.numel())
            root_s = s[:r].sqrt()
            layer.up.weight.zero_()
            layer.down.weight.zero_()
            layer.up.weight[:, :r] = u[:, :r] * root_s
            layer.down.weight[:r] = root_s.unsqueeze(-1) * vh[:r]
            if linear.bias is not None:
                layer.up.bias.copy_(linear.bias)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``activation(U (V x) + b)``."""
        check_input(x, self.in_features)
        return self.fn(self.up(self.down(x)))


class Dense(nn.Module):
    """``activation(linear(x))`` itself: the dense reference, `ralimp.create`'s ``"dense"``.

    Args:
        in_features: ``d``.
        out_features: ``l``.
        activation: registered name or elementwise callable (applied exactly).
        bias: learn a bias.
        seed: accepted for a call uniform with the other kinds; nothing is random.
        device: where parameters live.
        dtype: parameter dtype.
    """

    #: A dense layer has no random features; its budget is None.
    num_random_features = None

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        activation: str | Elementwise = "gelu",
        bias: bool = True,
        seed: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.in_features = check_positive_int("in_features", in_features)
        self.out_features = check_positive_int("out_features", out_features)
        self.activation_name, self.fn = resolve_activation(activation)
        self.linear = nn.Linear(in_features, out_features, bias=bias, device=device, dtype=dtype)

    @property
    def feature_dim(self) -> int:
        """The hidden width ``l``."""
        return self.out_features

    @classmethod
    def budget_options(
        cls, budget: int | None, activation: object = None, *, count: str = "paper", **overrides: Any
    ) -> dict[str, int]:
        """No options: the dense layer spends no random features, so ``budget`` must be None."""
        check_count(count)
        if budget is not None:
            raise BudgetError(
                f"budget: the dense layer has no random features; expected None, got {budget!r}"
            )
        return {}

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        activation: str | Elementwise = "gelu",
        *,
        sample: torch.Tensor | None = None,
        init: str = "psi",
        **kw: Any,
    ) -> Dense:
        """A copy of ``linear`` followed by ``activation`` (exact: ``sample`` and ``init`` change nothing)."""
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"linear: expected an nn.Linear, got {type(linear).__name__}")
        check_init(init, sample)
        kw.setdefault("device", linear.weight.device)
        kw.setdefault("dtype", linear.weight.dtype)
        layer = cls(
            linear.in_features, linear.out_features, activation=activation, bias=linear.bias is not None, **kw
        )
        layer.linear.load_state_dict(linear.state_dict())
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``activation(W x + b)``."""
        check_input(x, self.in_features)
        return self.fn(self.linear(x))
