r"""The RaLiMP layer: $\sigma(W x + b) \approx \Psi(W) \Phi(x)$ through a rational surrogate (Sec. 2)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import rf_matrices
from ralimp.base import (
    Elementwise,
    Factory,
    FeatureLinearization,
    augmented,
    check_input,
    resolve_activation,
    seeds,
    weight_matrices,
    work_dtype,
)
from ralimp.budget import check_budget, check_count, ralimp_split
from ralimp.calibration import Calibration, calibrate, layer_scales
from ralimp.discretized import DiscretizedFit, channel_coefficients, expected_value
from ralimp.features import complex_exponential_features, product_features
from ralimp.fits import FitOptions, Sizes, choose_atoms, fit_layer
from ralimp.quadrature import gauss_laguerre
from ralimp.rational import RationalFunction
from rf_matrices import WeightMatrix
from spectraformer_core import check_int, check_positive_int


def _inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))


def exponent_limit(dtype: torch.dtype) -> float:
    """The largest feature exponent ``dtype`` carries with room to spare.

    ``log(max) - 8``: 80.7 in float32, 701.8 in float64.
    """
    return math.log(torch.finfo(dtype).max) - 8


class RaLiMP(FeatureLinearization):
    r"""Rationally linearized feed-forward layer: $y = \Psi(W) \Phi(x) \approx \sigma(W x + b)$.

    The activation is replaced by its rational fit $R = P + \sum_j a_j$ and every part is linearized:

    - $P$ by EUGen product features on $[x; 1]$ and $[w; b]$ (``poly_features`` $= m$ rows per factor);
    - each atom $a_j$ by its Laplace representation, discretized at ``num_freqs`` Gauss-Laguerre nodes
      with per-node trainable channel weights, each node estimated with ``freq_features`` complex-exponential
      random features ([`ralimp.complex_exponential_features`][ralimp.complex_exponential_features]).

    The constructor builds the layer and does not fit it: $W, b$ get torch's ``nn.Linear`` initialization and
    every coefficient is 0 (the layer computes 0) until `load_linear` calibrates and fits it, or
    ``load_state_dict`` loads a fitted one. `from_linear` (and `ralimp.create`, `ralimp.replace_mlp`) builds
    and fits in one step, from a pretrained ``nn.Linear``; it takes the sizes and fit options as flat keywords
    (``num_atoms=2``, ``fit="paper"``, ...). ``RaLiMP.from_linear(nn.Linear(d, l), "gelu")`` is a fitted
    layer with fresh weights.

    The fit is made on the pre-activations the layer really sees (`ralimp.calibration`): every input of
    ``sample`` paired with every weight row, fit range the robust quantiles of $t$; without a sample the
    inputs are assumed standard normal ($t \sim \mathcal N(0, \lVert w\rVert^2 + b^2)$ per row, seeded
    draws). The fit is made in the basis this computes (``num_freqs`` nodes), so the layer's expectation over
    the projections is the fit (``expected_output == fit`` at initialization). ``options.fit`` chooses how:
    ``"variance"`` (default) minimizes bias$^2$ + the exact variance over the projections on the sample,
    ``"discretized"`` is least squares on the fit range, ``"paper"`` the continuous fit with node $k$
    weighted by $\gamma_k$ (the paper's initialization).

    The atoms live in the dilated variable $v = t / \tau^2$ (App. C.1: features at $u / \tau$ estimate
    $\cos(s_k t / \tau^2)$): their trainable $A', B', p', q'$ are in $v$ units, the fit bounds $q' \ge$
    ``q_floor``, and an atom given as a `RationalFunction` or `ralimp.DiscretizedFit` is realized as
    $a(t / \tau^2)$. ``tau="auto"`` sets $\tau^2 = c \operatorname{RMS}(t)$, so $\operatorname{RMS}(v) = 1/c$.

    The exponent guard (`check_exponent`) raises a ``ValueError`` before a forward pass whose bound on the
    estimators' log second moment, $2\sigma^2 = (s_k / q') \lVert x / \lambda + \lambda w\rVert^2 / \tau^2$
    (Prop. 1) for the largest input aligned with the largest weight row, exceeds what the work dtype carries
    (80.7 in float32). That bound is a variance, not the features' exponent: the features compute
    $e^{Z}$ with $Z = \sqrt{s/2}\, \omega \cdot u$, far smaller, and stay finite well past it
    (``exponent_guard=False`` runs them).

    Args:
        in_features: $d$.
        out_features: $l$.
        activation: a registered name (``"gelu"``, ``"gelu_tanh"``, ``"silu"``, ...; shipped fits), an
            elementwise callable, a `RationalFunction` (its atoms dilated, $P(t) + \sum_j a_j(t / \tau^2)$,
            then fitted like a callable, or used node by node with ``fit="paper"``) or a
            `ralimp.DiscretizedFit` (dilated likewise, used as is); the last two fix ``poly_degree`` and
            ``num_atoms``.
        poly_degree: $K$, over ``sizes.poly_degree`` (None: ``sizes``' value; so for the four below).
        poly_features: $m$ of the polynomial block, over ``sizes.poly_features``.
        num_atoms: $J$, over ``sizes.num_atoms``.
        num_freqs: Gauss-Laguerre nodes per atom, over ``sizes.num_freqs``.
        freq_features: random projections per node, over ``sizes.freq_features``.
        tau: the dilation, over ``options.tau`` (None: ``options``' value).
        sizes: `ralimp.fits.Sizes`: $K$ (``poly_degree``), $J$ (``num_atoms``; `from_linear` with
            ``fit="variance"`` chooses $0..J$, `plan_from_linear`), the Gauss-Laguerre nodes per atom
            (``num_freqs``), the projections of the polynomial block (``poly_features``, $m$) and per node
            (``freq_features``). None: ``Sizes()``, App. D.1's $K = 2$, $J = 1$, 3 nodes, 8 and 4.
        options: `ralimp.fits.FitOptions`, how `load_linear` fits (None: ``FitOptions()``):

            - ``fit``: ``"variance"``, ``"discretized"`` or ``"paper"`` (`ralimp.fits.FITS`);
            - ``tau``: the dilation $\tau$, or ``"auto"``: $\tau^2 = c \operatorname{RMS}(t)$ over the sample
              (standard-normal inputs when there is none), $c$ = ``tau_c``;
            - ``balance``: $\lambda$ of the rational features, evaluated at $[x; 1] / \lambda$ and
              $\lambda [w; b]$ ($t$ unchanged). 1 (the default) is the paper's layer. ``"auto"`` (a departure
              from the paper) takes $\lambda^2 = \operatorname{RMS} \lVert[x; 1]\rVert /
              \operatorname{RMS} \lVert[w; b]\rVert$, which minimizes
              $\mathbb E \lVert x/\lambda + \lambda w\rVert^2$, the exponent of the estimators' variance
              (Prop. 1); it keeps float32 features finite when $\lVert x\rVert \gg \lVert w\rVert$ but cannot
              lower the bound of `ralimp.analysis`;
            - ``interval``: fit on this interval instead of the sample's pre-activations (None: the
              sample's);
            - ``q_floor``: the smallest atom width $q'$, in $v = t / \tau^2$ units;
            - ``budget_count``: the count (``"paper"`` or ``"width"``) that `from_linear`'s choice of $J$
              keeps.
        bias: learn a bias $b$ (folded in as $[x; 1] \cdot [w; b]$).
        learn_poles: train $A, B, p, q$ (else they are buffers).
        weight_matrix: ``rf_matrices`` name (or class) of every projection matrix.
        seed: seed of the projections.
        exponent_guard: raise before a forward pass whose bound on the estimators' log second moment
            exceeds the work dtype's limit (`check_exponent`). False runs the layer as the paper writes it,
            whatever its variance does.
        device: where parameters live.
        dtype: parameter dtype.
        matrix_kw: extra keyword arguments of ``rf_matrices.create``.
    """

    # buffers, or parameters when ``learn_poles`` (``register_buffer``/``register_parameter``)
    nodes: torch.Tensor
    gammas: torch.Tensor
    tau: torch.Tensor
    scale: torch.Tensor
    atom_a: torch.Tensor
    atom_b: torch.Tensor
    atom_p: torch.Tensor
    atom_q_raw: torch.Tensor
    node_cos: torch.Tensor
    node_sin: torch.Tensor

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        activation: str | Elementwise | RationalFunction | DiscretizedFit = "gelu",
        poly_degree: int | None = None,
        poly_features: int | None = None,
        num_atoms: int | None = None,
        num_freqs: int | None = None,
        freq_features: int | None = None,
        tau: float | str | None = None,
        sizes: Sizes | None = None,
        options: FitOptions | None = None,
        bias: bool = True,
        learn_poles: bool = True,
        weight_matrix: str | type = "base",
        seed: int | None = None,
        exponent_guard: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        matrix_kw: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.exponent_guard = exponent_guard
        self.set_features(in_features, out_features)
        named = {
            "poly_degree": poly_degree,
            "poly_features": poly_features,
            "num_atoms": num_atoms,
            "num_freqs": num_freqs,
            "freq_features": freq_features,
        }
        sizes = Sizes.of({"sizes": sizes, **{k: v for k, v in named.items() if v is not None}})
        check_int("poly_degree", sizes.poly_degree, 0)
        check_int("num_atoms", sizes.num_atoms, 0)
        self.options = FitOptions.of({"options": options, **({} if tau is None else {"tau": tau})})
        self.learn_poles = learn_poles
        self.name = ""  # the module path, set by `replace_mlp` (error messages, `fit_record`)
        factory: Factory = {"device": device, "dtype": dtype or torch.get_default_dtype()}

        self.num_freqs = check_positive_int("num_freqs", sizes.num_freqs)
        self._set_target(activation, sizes.poly_degree, sizes.num_atoms)

        self._init_linear(bias, factory)
        self._init_projections(sizes, weight_matrix, seed, factory, matrix_kw or {})
        self._init_coefficients(factory)
        self.readout: nn.Parameter | None = None
        self._cache: tuple[tuple[tuple[int, int], ...], torch.Tensor] | None = None
        self._fit: DiscretizedFit | None = None  # set by load_linear
        self._calibration: Calibration | None = None

    def _init_linear(self, bias: bool, factory: Factory) -> None:
        """``W, b`` with ``nn.Linear``'s initialization (the global RNG)."""
        self.weight = nn.Parameter(torch.empty(self.out_features, self.in_features, **factory))
        self.bias = nn.Parameter(torch.empty(self.out_features, **factory)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            nn.init.uniform_(self.bias, -bound, bound)

    def _init_projections(
        self,
        sizes: Sizes,
        weight_matrix: str | type,
        seed: int | None,
        factory: Factory,
        matrix_kw: dict[str, Any],
    ) -> None:
        """The ``K`` polynomial projections and the ``J n`` node projections, seeded from ``seed``."""
        dim = self.in_features + 1
        seed_list = seeds(seed, self.poly_degree + self.num_atoms * self.num_freqs)
        self.poly_matrices: Sequence[WeightMatrix] = weight_matrices(
            rf_matrices.create(
                weight_matrix, sizes.poly_features, dim, seed=s, even_in_omega=True, **factory, **matrix_kw
            )
            for s in seed_list[: self.poly_degree]
        )
        self.freq_matrices: Sequence[WeightMatrix] = weight_matrices(
            rf_matrices.create(
                weight_matrix, sizes.freq_features, dim, seed=s, even_in_omega=False, **factory, **matrix_kw
            )
            for s in seed_list[self.poly_degree :]
        )
        nodes, gammas = gauss_laguerre(self.num_freqs)
        self.register_buffer("nodes", nodes.to(**factory))
        self.register_buffer("gammas", gammas.to(**factory))

    def _init_coefficients(self, factory: Factory) -> None:
        r"""$\tau$, $\lambda$ (1) and every coefficient of the fit (0): parameters, or buffers when fixed."""
        self.register_buffer("tau", torch.ones((), **factory))
        self.register_buffer("scale", torch.ones((), **factory))  # balance lambda
        self.poly_coef = nn.Parameter(torch.zeros(self.poly_degree + 1, **factory))
        self._pole_names = ("atom_a", "atom_b", "atom_p", "atom_q_raw")
        # without atoms the (empty) atom tensors are buffers: a parameter that never gets a gradient stops DDP
        for name in self._pole_names:
            value = torch.zeros(self.num_atoms, **factory)
            if self.learn_poles and self.num_atoms:
                self.register_parameter(name, nn.Parameter(value))
            else:
                self.register_buffer(name, value)
        for name in ("node_cos", "node_sin"):
            value = torch.zeros(self.num_atoms, self.num_freqs, **factory)
            if self.num_atoms:
                self.register_parameter(name, nn.Parameter(value))
            else:
                self.register_buffer(name, value)

    # ----------------------------------------------------------------------------------------------- init
    def _set_target(
        self,
        activation: str | Elementwise | RationalFunction | DiscretizedFit,
        poly_degree: int,
        num_atoms: int,
    ) -> None:
        """Keep what the fit approximates; a given rational or discretized fit fixes ``K`` and ``J``."""
        self.target: Elementwise | RationalFunction | DiscretizedFit
        if isinstance(activation, DiscretizedFit | RationalFunction):
            if (
                isinstance(activation, DiscretizedFit)
                and activation.num_atoms
                and activation.num_freqs != self.num_freqs
            ):
                raise ValueError(
                    f"activation: a DiscretizedFit for num_freqs={activation.num_freqs}, but the layer "
                    f"has num_freqs={self.num_freqs}"
                )
            self.activation_name, self.target = None, activation
            self.poly_degree, self.num_atoms = activation.poly_degree, activation.num_atoms
            return
        self.activation_name, self.target = resolve_activation(activation)
        self.poly_degree, self.num_atoms = poly_degree, num_atoms

    def sizes(self) -> Sizes:
        """The layer's shape as its fit sees it (`ralimp.fits.Sizes`)."""
        return Sizes(
            self.poly_degree,
            self.num_atoms,
            self.num_freqs,
            self.poly_matrices[0].num_features if self.poly_degree else 1,
            self.freq_matrices[0].num_features if self.num_atoms else 1,
        ).canonical()

    @staticmethod
    def calibrate(
        weight: torch.Tensor, bias: torch.Tensor | None, sample: torch.Tensor | None, options: FitOptions
    ) -> Calibration:
        r"""`ralimp.calibration.calibrate` of ``weight``, ``bias`` on ``sample`` at its $\tau$, $\lambda$."""
        tau, lam = layer_scales(
            weight, bias, sample, tau=options.tau, tau_c=options.tau_c, balance=options.balance
        )
        return calibrate(weight, bias, sample, tau=tau, balance=lam)

    @torch.no_grad()
    def load_linear(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        sample: torch.Tensor | None = None,
        calibration: Calibration | None = None,
        fits: Mapping[Sizes, DiscretizedFit] | None = None,
    ) -> None:
        r"""Set ``W, b``; calibrate $\tau$, $\lambda$ and fit on the pre-activations of ``sample`` with them.

        Every trainable coefficient is (re)initialized from the fit (``fit`` mode): $c_n$, the atoms
        $A', B', p', q'$ in $v = t / \tau^2$ units, and the per-node channel weights $\rho$; a free readout
        (``init="lstsq"``) is dropped. ``sample`` None: standard-normal inputs are assumed. ``calibration``
        (of these weights on ``sample``, `calibrate`) and ``fits`` (made on it, by the `Sizes.canonical` they
        were made for, in $t$ units) are reused instead of being computed again.
        """
        if weight.shape != self.weight.shape:
            raise ValueError(f"weight: expected shape {tuple(self.weight.shape)}, got {tuple(weight.shape)}")
        if (bias is None) != (self.bias is None):
            raise ValueError(
                f"bias: expected {'a tensor' if self.bias is not None else 'None'}, got {bias!r}"
            )
        if sample is not None:
            check_input(sample, self.in_features)
        self.weight.copy_(weight)
        if bias is not None:
            assert self.bias is not None, "bias: this layer was built with bias=False"
            self.bias.copy_(bias)
        if calibration is None:
            calibration = self.calibrate(weight, bias, sample, self.options)
        made = (fits or {}).get(self.sizes())
        fit = fit_layer(self.target, calibration, self.sizes(), self.options) if made is None else made
        self._calibration, self._fit = calibration, fit
        self.tau.fill_(calibration.tau)
        self.scale.fill_(calibration.balance)
        t2 = float(self.tau) ** 2
        self.poly_coef.copy_(torch.tensor(fit.poly, dtype=torch.float64))
        if self.num_atoms:
            atoms = fit.atom_table
            self.atom_a.copy_(atoms[:, 0] / t2**2)
            self.atom_b.copy_(atoms[:, 1] / t2)
            self.atom_p.copy_(atoms[:, 2] / t2)
            self.atom_q_raw.copy_(_inverse_softplus(atoms[:, 3] / t2))
            self.node_cos.copy_(fit.node_cos)
            self.node_sin.copy_(fit.node_sin)
        if self.readout is not None:
            for parameter in self._absorbed_by_readout():
                parameter.requires_grad_(True)
        self.readout = None
        self._cache = None

    @property
    def fit(self) -> DiscretizedFit:
        r"""The fit `load_linear` set the coefficients from, a `ralimp.DiscretizedFit` in $t$ units."""
        if self._fit is None:
            raise RuntimeError(self._not_fitted("fit"))
        return self._fit

    @property
    def calibration(self) -> Calibration:
        """The calibration `load_linear` fitted on (`ralimp.calibration.Calibration`)."""
        if self._calibration is None:
            raise RuntimeError(self._not_fitted("calibration"))
        return self._calibration

    def _not_fitted(self, what: str) -> str:
        name = self.name or f"RaLiMP({self.in_features} -> {self.out_features})"
        return (
            f"{what}: layer {name} was built and not fitted; build it with RaLiMP.from_linear or "
            "ralimp.create, or fit it with load_linear(weight, bias, sample=...)"
        )

    def set_readout(self, psi: torch.Tensor) -> None:
        r"""Replace $\Psi(W)$ by the free trainable readout ``psi`` ``(out_features, F)`` (``init="lstsq"``).

        From then on ``W, b``, $c_n$, $A, B, p$ and the node coefficients no longer reach the output (the
        readout absorbs them), so they stop requiring gradients (DDP refuses parameters that get none;
        `load_linear` turns them back on); the pole widths $q$ still set the frequencies of $\Phi$.
        """
        if psi.shape != (self.out_features, self.feature_dim):
            raise ValueError(
                f"psi: expected shape {(self.out_features, self.feature_dim)}, got {tuple(psi.shape)}"
            )
        self.readout = nn.Parameter(psi.detach().to(self.weight))
        for parameter in self._absorbed_by_readout():
            parameter.requires_grad_(False)
        self._cache = None

    def _absorbed_by_readout(self) -> list[nn.Parameter]:
        r"""The parameters that only $\Psi(W)$ uses: ``W, b``, $c_n$, $A, B, p$, the node coefficients."""
        names = ("weight", "bias", "poly_coef", "atom_a", "atom_b", "atom_p", "node_cos", "node_sin")
        return [p for name in names if isinstance(p := getattr(self, name), nn.Parameter)]

    @classmethod
    def budget_options(
        cls, budget: int | None, activation: object = None, *, count: str = "paper", **overrides: Any
    ) -> dict[str, Any]:
        """``poly_features`` and ``freq_features`` that spend ``budget`` exactly (``budget.ralimp_split``).

        Also ``budget_count``: the count `from_linear`'s choice of $J$ keeps. ``poly_degree``, ``num_atoms``
        and ``num_freqs`` come from ``overrides`` (defaults `ralimp.fits.Sizes`; a
        `RationalFunction` activation fixes $K$ and $J$); one of ``poly_features`` and
        ``freq_features`` may be fixed there too.
        """
        if isinstance(activation, RationalFunction):
            overrides = {
                **overrides,
                "poly_degree": activation.poly_degree,
                "num_atoms": activation.num_atoms,
            }
        sizes: dict[str, Any] = ralimp_split(
            check_budget(budget),
            check_count(count),
            poly_degree=overrides.get("poly_degree", Sizes.poly_degree),
            num_atoms=overrides.get("num_atoms", Sizes.num_atoms),
            num_freqs=overrides.get("num_freqs", Sizes.num_freqs),
            poly_features=overrides.get("poly_features"),
            freq_features=overrides.get("freq_features"),
        )
        return {**sizes, "budget_count": count}

    @classmethod
    def plan_from_linear(
        cls, linear: nn.Linear, activation: str | Elementwise, sample: torch.Tensor | None, kw: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        r"""Calibrate ``linear`` on ``sample`` once; with ``fit="variance"`` (the default) also choose $J$.

        `from_linear` builds the layer with the plan and loads ``linear`` with this calibration (and the
        chosen fit). The choice (`ralimp.fits.choose_atoms`): each $j = 0..J$ (``num_atoms`` is the most) is
        fitted and scored by its expected squared error on the calibration pairs (bias$^2$ + exact variance);
        the best wins. The random features that fewer atoms free go to the polynomial block, so
        ``num_random_features`` (``budget_count="paper"``) or ``feature_dim`` (``"width"``) stays as given.
        ``layer.fit_record()`` records the choice.

        ``kw`` holds `from_linear`'s keywords: the sizes and fit options flat (``num_atoms=2``,
        ``fit="paper"``; over ``sizes=`` and ``options=`` when those are given too), the constructor's other
        keywords as they are. The plan groups them into the constructor's ``sizes`` and ``options``.
        """
        grouped = {f.name for f in fields(Sizes)} | {f.name for f in fields(FitOptions)}
        plan = {name: value for name, value in kw.items() if name not in grouped}
        options, sizes = FitOptions.of(kw), Sizes.of(kw)
        plan["options"] = options
        bias = None if linear.bias is None else linear.bias.detach()
        cal = cls.calibrate(linear.weight.detach(), bias, sample, options)
        given = isinstance(activation, RationalFunction | DiscretizedFit)
        if given or options.fit != "variance" or not sizes.num_atoms:
            return {**plan, "sizes": sizes}, {"calibration": cal}
        chosen, fit = choose_atoms(resolve_activation(activation)[1], cal, sizes, options)
        return {**plan, "sizes": chosen}, {"calibration": cal, "fits": {chosen.canonical(): fit}}

    def fit_record(self) -> dict[str, Any]:
        """What the fit chose: `FeatureLinearization.fit_record` plus mode, range, ``tau``, ``J``, widths.

        A layer built and not fitted (`load_linear`) has ``fit_range`` None and ``calibration``
        ``"not fitted"``.
        """
        cal, fit = self._calibration, self._fit
        source = "not fitted" if cal is None else "standard-normal inputs" if cal.synthetic else "sample"
        return {
            **super().fit_record(),
            "fit": self.options.fit,
            "fit_range": None if fit is None else [round(v, 6) for v in fit.interval],
            "calibration": source,
            "tau": round(float(self.tau), 6),
            "num_atoms": self.num_atoms,
            "pole_widths_v": [round(float(q), 6) for q in self.pole_widths().detach()],
        }

    # ------------------------------------------------------------------------------------------- features
    @property
    def num_random_features(self) -> int:
        r"""The paper's budget: $m_\mathrm{poly} + 2 J n_\mathrm{freq} m$ (Sec. D.1: $8 + 24 = 32$)."""
        m_poly = self.poly_matrices[0].num_features if self.poly_degree else 0
        return m_poly + sum(2 * mat.num_features for mat in self.freq_matrices)

    @property
    def feature_dim(self) -> int:
        r"""$F$, the width of $\Phi(x)$: $1 + K m_\mathrm{poly} + 2 J n_\mathrm{freq} m$."""
        poly = sum(m.num_features for m in self.poly_matrices)
        return 1 + poly + sum(2 * m.num_features for m in self.freq_matrices)

    def pole_widths(self) -> torch.Tensor:
        r"""$q'$ per atom, in $v = t / \tau^2$ units (multiply by $\tau^2$ for $t$ units)."""
        return F.softplus(self.atom_q_raw)

    def _projections(
        self, dtype: torch.dtype
    ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
        """Dense poly projections, stacked frequency projections ``(J n m, D)``, row weights, frequencies."""
        poly = [m.matrix().to(dtype) for m in self.poly_matrices]
        if not self.num_atoms:
            empty = torch.zeros(0, dtype=dtype, device=self.weight.device)
            return poly, empty.reshape(0, self.in_features + 1), empty, empty
        omega = torch.cat([m.matrix().to(dtype) for m in self.freq_matrices])
        weights, freqs = [], []
        q = self.pole_widths().to(dtype)
        for index, mat in enumerate(self.freq_matrices):
            j, k = divmod(index, self.num_freqs)
            count = mat.num_features
            cw = mat.component_weights
            weights.append(
                torch.full((count,), 1.0 / count, dtype=dtype, device=omega.device)
                if cw is None
                else cw.to(dtype)
            )
            freqs.append((self.nodes[k].to(dtype) / q[j]).expand(count))
        return poly, omega, torch.cat(weights), torch.cat(freqs)

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        r"""$\Phi(x) = [1, \phi_{1..K}([x;1]), \operatorname{Re} z, \operatorname{Im} z]$, ``(..., F)``.

        $z$ is evaluated at $[x;1] / (\lambda\tau)$.
        """
        check_input(x, self.in_features)
        dtype = work_dtype(x.dtype)
        u = augmented(x.to(dtype))
        poly, omega, _, freqs = self._projections(dtype)
        parts = [torch.ones_like(u[..., :1]), *product_features(u, poly)]
        if self.num_atoms:
            self.check_exponent(u, freqs)
            re, im = complex_exponential_features(u / (self.scale * self.tau).to(dtype), omega, freqs)
            parts += [re, im]
        return torch.cat(parts, -1)

    @torch.no_grad()
    def check_exponent(self, u: torch.Tensor, freqs: torch.Tensor) -> None:
        r"""Raise a ``ValueError`` when the bound on the estimators' log second moment over ``u`` is large.

        ``u`` is ``(..., D)`` ($[x; 1]$). The bound is $2\sigma^2 = (s_k / q') \lVert x / \lambda + \lambda
        w\rVert^2 / \tau^2$, the log of the estimator's second moment $\mathbb E|Y_k|^2 = e^{2\sigma^2}$
        (Prop. 1, Eq. 13), over the batch bounded by $\max_k (s_k / q') (\max \lVert x\rVert / \lambda +
        \lambda \max \lVert w\rVert)^2 / \tau^2$ (equal when the largest input and weight row are aligned;
        the weight side is 0 under a free readout). The limit is `exponent_limit` of ``u``'s dtype (80.7
        float32, 701.8 float64), past which that second moment is not representable. It is not the exponent
        the features compute ($Z = \sqrt{s/2}\, \omega \cdot u$, far smaller): a batch it refuses has
        finite features as a rule, and an estimator whose variance swamps its mean; ``exponent_guard=False``
        skips the check.

        The bound is computed with tensor operations and read once (one host sync per forward pass in eager
        mode, none more for the error message unless it fires). While ``torch.compile`` traces the layer the
        check is skipped, so the compiled graph has no break; a compiled model relies on its trainer's
        non-finite-loss stop instead.
        """
        if not self.exponent_guard or not u.numel() or not freqs.numel() or torch.compiler.is_compiling():
            return
        exponent = self.exponent_bound(u, freqs)
        limit = exponent_limit(u.dtype)
        if bool(exponent <= limit):
            return
        name = self.name or f"RaLiMP({self.in_features} -> {self.out_features})"
        tau = float(self.tau)
        raise ValueError(
            f"x: in layer {name}, the bound on the estimators' log second moment (Prop. 1), 2 sigma^2 = "
            "(s_k/q) ||x/lambda + lambda w||^2 / tau^2 for the largest input and weight row aligned, reaches "
            f"{float(exponent):.4g} on this batch (limit {limit:.1f}; the second moment e^(2 sigma^2) would "
            f"overflow {u.dtype}; max ||[x; 1]|| = {float(u.norm(dim=-1).max()):.4g}, tau = {tau:.4g}, "
            f"narrowest width q' = {float(self.pole_widths().min()):.4g}). The features' own exponent is far "
            "smaller; it is their variance that swamps the output (exponent_guard=False runs the layer "
            "anyway). Remedies: "
            "normalize or rescale the layer's inputs, recalibrate on inputs like these "
            "(load_linear(..., sample=...)), fit='variance' "
            "(wider poles or num_atoms=0), balance='auto', or float64."
        )

    @torch.no_grad()
    def exponent_bound(self, u: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        r"""The bound of `check_exponent` on the batch ``u`` ``(..., D)``, a 0-d tensor (no host sync)."""
        lam, tau = self.scale.to(u.dtype), self.tau.to(u.dtype)
        side = u.norm(dim=-1).max() / (lam * tau)
        if self.readout is None:
            w = self.weight.detach().to(u.dtype)
            w_sq = w.pow(2).sum(-1)
            if self.bias is not None:
                w_sq = w_sq + self.bias.detach().to(u.dtype) ** 2
            side = side + w_sq.max().sqrt() * lam / tau
        return freqs.max() * side**2

    def node_coefficients(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Per node, the coefficients $(w_c, w_s)$ of $C_k \approx \cos(s_k v / q')$ and $S_k$, ``(J, n)``.

        `ralimp.discretized.channel_coefficients` of the poles in $v = t / \tau^2$ units (Sec. 2.4).
        """
        atoms = torch.stack([self.atom_a, self.atom_b, self.atom_p, self.pole_widths()], -1).to(dtype)
        return channel_coefficients(
            atoms, self.node_cos.to(dtype), self.node_sin.to(dtype), self.nodes.to(dtype)
        )

    def weight_features(self) -> torch.Tensor:
        r"""$\Psi(W)$, ``(out_features, F)``: the weight-row side of every block, coefficients folded in.

        The free readout instead, once `set_readout` (``init="lstsq"``) has set one.
        """
        if self.readout is not None:
            return self.readout
        dtype = work_dtype(self.weight.dtype)
        w = self.weight.to(dtype)
        b = torch.zeros_like(w[:, 0]) if self.bias is None else self.bias.to(dtype)
        u = torch.cat([w, b.unsqueeze(-1)], -1)
        poly, omega, row_weights, freqs = self._projections(dtype)
        coef = self.poly_coef.to(dtype)
        parts = [coef[0].expand(u.shape[0], 1)]
        for n, phi in enumerate(product_features(u, poly), start=1):
            parts.append(phi * (coef[n] / phi.shape[-1]))
        if self.num_atoms:
            re, im = complex_exponential_features(u * (self.scale / self.tau).to(dtype), omega, freqs)
            w_c, w_s = self.node_coefficients(dtype)
            counts = [m.num_features for m in self.freq_matrices]
            w_c = torch.repeat_interleave(w_c.reshape(-1), torch.tensor(counts, device=w_c.device))
            w_s = torch.repeat_interleave(w_s.reshape(-1), torch.tensor(counts, device=w_s.device))
            parts += [row_weights * (w_c * re + w_s * im), row_weights * (w_s * re - w_c * im)]
        return torch.cat(parts, -1)

    def psi(self) -> torch.Tensor:
        r"""$\Psi(W)$: recomputed in training mode, cached in eval mode until a parameter changes."""
        if self.training:
            self._cache = None
            return self.weight_features()
        key = tuple((p.data_ptr(), p._version) for p in self.parameters())
        if self._cache is None or self._cache[0] != key:
            with torch.no_grad():
                self._cache = (key, self.weight_features())
        return self._cache[1]

    def expected_output(self, t: torch.Tensor) -> torch.Tensor:
        r"""The layer's output in expectation over the projections, as a function of $t = w \cdot x + b$.

        $P(t) + \sum_{jk} [w_c \cos(s_k t / (q' \tau^2)) + w_s \sin(s_k t / (q' \tau^2))]$: at initialization
        exactly ``self.fit(t)`` (the fit is made in this basis); the random features only add variance.
        """
        dtype = work_dtype(t.dtype)
        w_c, w_s = self.node_coefficients(dtype)
        widths = self.pole_widths().to(dtype) * self.tau.to(dtype) ** 2
        return expected_value(t.to(dtype), self.poly_coef.to(dtype), w_c, w_s, self.nodes.to(dtype), widths)

    def extra_repr(self) -> str:
        """Sizes and options shown by ``repr``."""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, activation="
            f"{self.activation_name!r}, K={self.poly_degree}, J={self.num_atoms}, "
            f"num_freqs={self.num_freqs}, "
            f"num_random_features={self.num_random_features}, tau={float(self.tau):.4g}"
        )
