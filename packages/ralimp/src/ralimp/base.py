"""What every linearized layer shares: ``y = Psi(W) Phi(x)``, ``from_linear``, ``compress``."""

from __future__ import annotations

import abc
import copy
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Self, TypedDict, cast

import torch
from torch import nn

from ralimp.activations import ACTIVATIONS
from ralimp.ridge import scaled_ridge_solve
from rf_matrices import WeightMatrix
from spectraformer_core import check_positive_int

Elementwise = Callable[[torch.Tensor], torch.Tensor]
"""An elementwise function of a tensor (an activation, a fit)."""


class Factory(TypedDict):
    """The ``device`` and ``dtype`` keywords every layer passes to its tensor constructors."""

    device: torch.device | str | None
    dtype: torch.dtype | None


def weight_matrices(matrices: Iterable[WeightMatrix]) -> Sequence[WeightMatrix]:
    """``nn.ModuleList(matrices)``, typed as the sequence of projections it holds."""
    return cast("Sequence[WeightMatrix]", nn.ModuleList(matrices))


def check_input(x: object, dim: int) -> torch.Tensor:
    """Raise a ``ValueError`` unless ``x`` is a floating tensor ``(..., dim)``."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"x: expected a floating-point tensor (..., {dim}), got {x!r:.80}")
    if x.dim() == 0 or x.shape[-1] != dim:
        raise ValueError(f"x: expected last dimension {dim} (in_features), got shape {tuple(x.shape)}")
    return x


def resolve_activation(
    activation: str | Elementwise,
) -> tuple[str | None, Elementwise]:
    """``(name or None, elementwise function)`` of a registered name or a callable."""
    if isinstance(activation, str):
        return activation.lower(), ACTIVATIONS.get(activation)
    if callable(activation):
        return None, activation
    raise ValueError(
        f"activation: expected a registered name ({', '.join(ACTIVATIONS.names())}) or a callable, "
        f"got {activation!r}"
    )


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Features are computed in at least float32 (bfloat16 inputs are upcast, the output cast back)."""
    return torch.promote_types(dtype, torch.float32)


def augmented(x: torch.Tensor) -> torch.Tensor:
    """``[x; 1]``: the bias folds into the weight row ``[w; b]``."""
    return torch.cat([x, torch.ones_like(x[..., :1])], -1)


def seeds(seed: int | None, count: int) -> list[int]:
    """``count`` seeds derived from ``seed`` (from the global torch RNG when None)."""
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    return [int(v) for v in torch.randint(0, 2**62, (count,), generator=gen)]


def default_linear(
    out_features: int, in_features: int, bias: bool, factory: Factory
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weights of a freshly initialized ``nn.Linear`` (torch's default init, global RNG)."""
    linear = nn.Linear(in_features, out_features, bias=bias, **factory)
    return linear.weight.detach(), None if linear.bias is None else linear.bias.detach()


@dataclass(frozen=True)
class LinearSource:
    """What `LinearReplacement.from_linear` initializes a layer from: its arguments and the class's plan."""

    linear: nn.Linear
    activation: str | Elementwise
    sample: torch.Tensor | None
    init: str
    ridge: float
    prepared: dict[str, Any]


class LinearReplacement(nn.Module, abc.ABC):
    """A layer standing in for ``activation(linear(x))``, built from a pretrained ``nn.Linear``.

    [`from_linear`][ralimp.LinearReplacement.from_linear] is the same for every kind: check its arguments,
    let the class plan its options (`plan_from_linear`), construct, then initialize from ``linear``
    (`initialize_from`).
    """

    in_features: int
    out_features: int

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
    ) -> Self:
        """A layer approximating ``activation(linear(x))``, initialized from ``linear``'s weights.

        Args:
            linear: the pretrained ``nn.Linear``.
            activation: a registered activation name or an elementwise callable.
            sample: calibration inputs ``(..., in_features)``: they set the data-dependent scales and, with
                ``init="lstsq"``, the readout.
            init: ``"psi"``, the paper's ``Psi(W)`` (unbiased for the fit, log-normal variance); or
                ``"lstsq"``, the readout fitted by ridge least squares of ``activation(linear(sample))`` on
                ``Phi(sample)`` (needs ``sample``; `FeatureLinearization.fit_readout`).
            ridge: the ridge of ``init="lstsq"``, relative to the mean squared (normalized) feature.
            **kw: constructor options of the class (`plan_from_linear` may regroup them).
        """
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"linear: expected an nn.Linear, got {type(linear).__name__}")
        check_init(init, sample)
        kw, prepared = cls.plan_from_linear(linear, activation, sample, kw)
        kw.setdefault("device", linear.weight.device)
        kw.setdefault("dtype", linear.weight.dtype)
        layer = cls(
            linear.in_features, linear.out_features, activation=activation, bias=linear.bias is not None, **kw
        )
        with torch.no_grad():
            layer.initialize_from(LinearSource(linear, activation, sample, init, ridge, prepared))
        return layer

    @classmethod
    def plan_from_linear(
        cls, linear: nn.Linear, activation: str | Elementwise, sample: torch.Tensor | None, kw: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(constructor options, what initialize_from reuses)``, before the build: ``(kw, {})`` here."""
        return kw, {}

    @abc.abstractmethod
    def initialize_from(self, source: LinearSource) -> None:
        """Set the layer from ``source.linear`` (built by `from_linear`)."""

    def set_features(self, in_features: int, out_features: int) -> None:
        """Check and keep ``in_features`` and ``out_features`` (every constructor's first step)."""
        self.in_features = check_positive_int("in_features", in_features)
        self.out_features = check_positive_int("out_features", out_features)

    def set_up(
        self,
        in_features: int,
        out_features: int,
        activation: str | Elementwise,
        device: torch.device | str | None,
        dtype: torch.dtype | None,
    ) -> Factory:
        """`set_features`, then ``activation_name`` and ``fn`` (`resolve_activation`); returns the factory.

        The baselines' first step; the factory's dtype defaults to torch's default dtype.
        """
        self.set_features(in_features, out_features)
        self.activation_name, self.fn = resolve_activation(activation)
        return {"device": device, "dtype": dtype or torch.get_default_dtype()}


class ExactActivation(LinearReplacement):
    """``activation(A x)`` with an explicit linear map ``A`` (`Dense`, `LowRank`): the activation is exact."""

    fn: Elementwise

    @abc.abstractmethod
    def linear_map(self, x: torch.Tensor) -> torch.Tensor:
        """``A x``: ``(..., in_features)`` -> ``(..., out_features)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``activation(A x)``: ``(..., in_features)`` -> ``(..., out_features)``."""
        check_input(x, self.in_features)
        return self.fn(self.linear_map(x))


class FeatureLinearization(LinearReplacement):
    """A layer ``y = Psi(W) Phi(x)`` standing in for ``activation(x @ W.T + b)``.

    Subclasses give [`feature_map`][ralimp.FeatureLinearization.feature_map] (``Phi``, on the input) and
    [`weight_features`][ralimp.FeatureLinearization.weight_features] (``Psi``, one row per output unit);
    ``forward`` is one matmul, and [`compress`][ralimp.FeatureLinearization.compress] folds a following linear
    layer in.
    """

    in_features: int
    out_features: int

    @abc.abstractmethod
    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        """``Phi(x)``: ``(..., in_features)`` -> ``(..., F)``, in at least float32."""

    @abc.abstractmethod
    def weight_features(self) -> torch.Tensor:
        """``Psi(W)``: ``(out_features, F)``."""

    @property
    @abc.abstractmethod
    def num_random_features(self) -> int:
        """The feature budget as the paper counts it."""

    def psi(self) -> torch.Tensor:
        """``Psi(W)``; subclasses may cache it."""
        return self.weight_features()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``Psi(W) Phi(x)``: ``(..., in_features)`` -> ``(..., out_features)``."""
        check_input(x, self.in_features)
        phi = self.feature_map(x)
        return (phi @ self.psi().to(phi.dtype).mT).to(x.dtype)

    @torch.no_grad()
    def compress(self, next_linear: nn.Linear) -> CompressedLinearization:
        """Fold ``next_linear`` (``W'``, ``b'``) in: ``W' Psi(W) Phi(x) + b' = W_hat Phi(x) + b'`` (App. B).

        Returns a [`CompressedLinearization`][ralimp.CompressedLinearization] that computes
        ``next_linear(self(x))`` with one ``(out, F)`` matrix ``W_hat = W' Psi(W)`` (a snapshot: later
        training of ``self`` does not reach it).
        """
        if not isinstance(next_linear, nn.Linear) or next_linear.in_features != self.out_features:
            raise ValueError(
                f"next_linear: expected an nn.Linear with in_features={self.out_features}, "
                f"got {next_linear!r}"
            )
        psi = self.psi()
        w_hat = next_linear.weight.to(psi.dtype) @ psi
        bias = None if next_linear.bias is None else next_linear.bias.detach().clone()
        return CompressedLinearization(self.frozen_feature_map(), w_hat.to(next_linear.weight.dtype), bias)

    def frozen_feature_map(self) -> FrozenFeatureMap:
        """A snapshot of `feature_map` that no longer depends on this module's parameters."""
        return FrozenFeatureMap(self)

    @property
    def feature_dim(self) -> int:
        """``F``, the width of ``Phi(x)`` (the rank bound of every separable readout)."""
        return self.psi().shape[-1]

    def fit_record(self) -> dict[str, object]:
        """The kind, the budget as the paper counts it and the feature width ``F`` (`ralimp.fit_summary`)."""
        return {
            "kind": type(self).__name__,
            "budget": self.num_random_features,
            "feature_width": self.feature_dim,
        }

    def initialize_from(self, source: LinearSource) -> None:
        """`load_linear` (with what `plan_from_linear` prepared), then the readout of ``init="lstsq"``."""
        linear, sample = source.linear, source.sample
        bias = None if linear.bias is None else linear.bias.detach()
        self.load_linear(linear.weight.detach(), bias, sample=sample, **source.prepared)
        if source.init == "lstsq":
            assert sample is not None  # check_init refuses init="lstsq" without a sample
            target = self.target_function(source.activation)(linear(sample.to(linear.weight.dtype)))
            self.fit_readout(sample, target, ridge=source.ridge)

    def target_function(self, activation: str | Elementwise) -> Elementwise:
        """The elementwise function ``init="lstsq"`` fits: the activation itself, not its surrogate."""
        return resolve_activation(activation)[1]

    @torch.no_grad()
    def fit_readout(self, sample: torch.Tensor, target: torch.Tensor, *, ridge: float = 1e-6) -> None:
        r"""Set the readout to the ridge least-squares fit of ``target`` ($Y$) on $\Phi(X)$, $X$ = ``sample``.

        $\Psi = \arg\min \lVert \Phi(X) \Psi^\top - Y\rVert^2 + \mathrm{ridge}\, N \lVert D \Psi^\top\rVert^2$
        with $D$ the RMS of each feature column (so the ridge is relative and scale-free), solved in float64.

        Args:
            sample: ``(..., in_features)``.
            target: ``(..., out_features)``, e.g. ``activation(linear(sample))``.
            ridge: relative ridge ``>= 0``.
        """
        check_input(sample, self.in_features)
        if target.shape[:-1] != sample.shape[:-1] or target.shape[-1] != self.out_features:
            raise ValueError(
                f"target: expected shape {(*sample.shape[:-1], self.out_features)}, got {tuple(target.shape)}"
            )
        self.set_readout(ridge_readout(self.feature_map(sample), target, ridge))

    def set_readout(self, psi: torch.Tensor) -> None:
        """Make ``psi`` ``(out_features, F)`` the layer's trainable readout."""
        raise NotImplementedError(f"{type(self).__name__} has no free readout")

    @abc.abstractmethod
    def load_linear(
        self, weight: torch.Tensor, bias: torch.Tensor | None, *, sample: torch.Tensor | None = None
    ) -> None:
        """Initialize from a pretrained ``weight (out, in)`` and ``bias (out,)``."""


class ReadoutLinearization(FeatureLinearization):
    """A `FeatureLinearization` whose ``Psi`` is one trainable matrix ``psi_weight`` (EUGen, SNNK)."""

    psi_weight: nn.Parameter

    def init_readout(self, width: int, bias: bool, factory: Factory) -> None:
        """A trainable ``Psi`` ``(out_features, width)`` loaded from a fresh ``nn.Linear`` (`default_linear`).

        The constructors' last step.
        """
        self.psi_weight = nn.Parameter(torch.zeros(self.out_features, width, **factory))
        self.load_linear(*default_linear(self.out_features, self.in_features, bias, factory))

    def weight_features(self) -> torch.Tensor:
        """The trainable ``Psi``, ``(out_features, F)``."""
        return self.psi_weight

    def set_readout(self, psi: torch.Tensor) -> None:
        """Copy ``psi`` ``(out_features, F)`` into the trainable ``Psi``."""
        self.psi_weight.copy_(psi)


class FrozenFeatureMap(nn.Module):
    """A deep copy of a layer kept only for its input features ``Phi``, with parameters turned to buffers."""

    def __init__(self, layer: FeatureLinearization) -> None:
        super().__init__()
        self.layer = copy.deepcopy(layer)
        for module in self.layer.modules():
            for name, param in list(module.named_parameters(recurse=False)):
                delattr(module, name)
                module.register_buffer(name, param.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``Phi(x)``."""
        return self.layer.feature_map(x)


class CompressedLinearization(nn.Module):
    """``W_hat Phi(x) + b'``: a linearized layer with the following ``nn.Linear`` folded in.

    Args:
        feature_map: ``Phi`` as a module.
        weight: ``W_hat = W' Psi(W)``, ``(out, F)``, trainable.
        bias: ``b'`` or None.
    """

    def __init__(
        self, feature_map: FrozenFeatureMap, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> None:
        super().__init__()
        self.features = feature_map
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)
        self.in_features = feature_map.layer.in_features
        self.out_features = weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., in_features)`` -> ``(..., out_features)``."""
        check_input(x, self.in_features)
        phi = self.features(x)
        y = phi @ self.weight.to(phi.dtype).mT
        if self.bias is not None:
            y = y + self.bias.to(phi.dtype)
        return y.to(x.dtype)


#: The initializations ``from_linear`` knows.
INITS = ("psi", "lstsq")


def check_init(init: object, sample: torch.Tensor | None) -> None:
    """Raise a ``ValueError`` unless ``init`` is known and ``"lstsq"`` comes with a ``sample``."""
    if init not in INITS:
        raise ValueError(f"init: expected one of {INITS}, got {init!r}")
    if init == "lstsq" and sample is None:
        raise ValueError("sample: init='lstsq' fits the readout to a calibration sample; got sample=None")


def ridge_readout(phi: torch.Tensor, target: torch.Tensor, ridge: float) -> torch.Tensor:
    r"""The ridge least-squares readout $\Psi$ ``(out, F)``, float64.

    It minimizes, with $Y$ = ``target``,
    $\lVert \phi \Psi^\top - Y\rVert^2 + \mathrm{ridge}\, N \lVert D \Psi^\top\rVert^2$. ``phi`` ``(..., F)``
    and ``target`` ``(..., out)``; ``D`` holds the RMS of each column of ``phi``.
    """
    if not ridge >= 0:
        raise ValueError(f"ridge: expected a number >= 0, got {ridge!r}")
    x = phi.detach().reshape(-1, phi.shape[-1]).to(torch.float64)
    y = target.detach().reshape(-1, target.shape[-1]).to(x)
    if not torch.isfinite(x).all():
        raise ValueError(
            "sample: the features Phi(sample) overflow float64 (the random features grow like "
            "exp(||x|| ||w||)); rescale the inputs or use fewer/larger-width poles"
        )
    return scaled_ridge_solve(x, y, ridge=ridge).mT
