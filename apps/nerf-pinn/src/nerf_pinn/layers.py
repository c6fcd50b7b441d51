"""The feed-forward layer of every coordinate network, and its linearized replacements from ``ralimp``.

Every network here is a stack of `FeedForward` layers ``activation(scale * (W x + b))`` (tanh for
the PINN, ``sin`` with ``scale = omega_0`` for SIREN, relu for NeRF) followed by plain ``nn.Linear`` heads.
`linearize_mlp_layers` swaps chosen layers for a ``ralimp`` layer of the registered kind (``ralimp``,
``snnk``, ``eugen``) made by ``ralimp.create`` from the layer's own weights (``scale`` folded into
``W, b``), which spends the same feature budget exactly for every kind (``num_random_features == budget``),
so the kinds are compared at equal numbers of random features.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

import ralimp
from spectraformer_core import check_int

DENSE = "dense"
KINDS = (DENSE, "ralimp", "snnk", "eugen")
"""The variants every family compares: the dense MLP and the three linearized replacements."""


class Sine(nn.Module):
    """``sin(x)`` as a module (SIREN's activation; ``scale = omega_0`` lives in `FeedForward`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``sin(x)``."""
        return torch.sin(x)


ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU, "sin": Sine}
"""Activation name -> module factory (``sin`` is not a ``ralimp`` activation: it is fitted on demand)."""


class FeedForward(nn.Module):
    """``activation(scale * (W x + b))``: ``(..., in_features)`` -> ``(..., out_features)``."""

    def __init__(self, in_features: int, out_features: int, activation: str, *, scale: float = 1.0) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation: expected one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.linear = nn.Linear(in_features, out_features)
        self.activation_name, self.scale = activation, float(scale)
        self.activation = ACTIVATIONS[activation]()

    def preactivation(self, x: torch.Tensor) -> torch.Tensor:
        """``t = scale * (W x + b)``."""
        return self.scale * self.linear(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``activation(t)``."""
        return self.activation(self.preactivation(x))

    def scaled_linear(self) -> nn.Linear:
        """An ``nn.Linear`` computing ``t`` (``scale`` folded into a copy of ``W, b``)."""
        linear = nn.Linear(self.linear.in_features, self.linear.out_features)
        linear = linear.to(self.linear.weight.device, self.linear.weight.dtype)
        with torch.no_grad():
            linear.weight.copy_(self.scale * self.linear.weight)
            linear.bias.copy_(self.scale * self.linear.bias)
        return linear

    def extra_repr(self) -> str:
        """The activation and the scale."""
        return f"activation={self.activation_name!r}, scale={self.scale:g}"


class FeedForwardStack(nn.Module):
    """``depth`` `FeedForward` layers of ``width`` units, then a linear head (the PINN's and SIREN's form).

    ``layers`` is the stack `linearize_mlp_layers` replaces in; a subclass's ``forward`` prepares the
    input of `stack`.

    Args:
        in_features: input dimension.
        out_features: output dimension.
        depth: layers of the stack.
        width: units per layer.
        activation: a name of `ACTIVATIONS`, of every layer.
        scale: every layer's pre-activation factor.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        depth: int,
        width: int,
        activation: str,
        *,
        scale: float = 1.0,
    ) -> None:
        super().__init__()
        check_int("depth", depth, 1)
        check_int("width", width, 1)
        self.layers = nn.ModuleList(
            FeedForward(in_features if i == 0 else width, width, activation, scale=scale)
            for i in range(depth)
        )
        self.head = nn.Linear(width, out_features)

    def stack(self, x: torch.Tensor) -> torch.Tensor:
        """The layers, then the head: ``(..., in_features)`` -> ``(..., out_features)``."""
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


#: The layer options (``--poly-degree``, ``--num-atoms``, ``--num-freqs``, ``--balance``, ``--fit``) each kind
#: takes (the budget itself is spent by ``ralimp.create``).
SHAPE_OPTIONS: dict[str, tuple[str, ...]] = {
    "ralimp": ("poly_degree", "num_atoms", "num_freqs", "balance", "fit"),
    "eugen": ("poly_degree",),
    "snnk": ("balance",),
}

#: RaLiMP's fit modes (``--fit``), ``ralimp.fits.FITS``.
FIT_MODES: tuple[str, ...] = tuple(ralimp.fits.FITS.names())


def sine_fit_interval(t: torch.Tensor, *, margin: float = 1.1, minimum: float = 1.0) -> tuple[float, float]:
    """The symmetric interval ``[-T, T]`` covering the pre-activations ``t`` (with a margin)."""
    half = max(float(t.detach().abs().max()) * margin, minimum)
    return (-half, half)


def linearize_mlp_layers(
    layers: nn.ModuleList,
    kind: str,
    *,
    budget: int,
    indices: list[int],
    inputs: list[torch.Tensor],
    poly_degree: int = 2,
    num_atoms: int = 1,
    num_freqs: int = 3,
    weight_matrix: str = "base",
    balance: float | str = 1.0,
    fit_range: float = 0.0,
    fit: str = "variance",
    seed: int = 0,
) -> list[int]:
    """Replace ``layers[i]`` (a `FeedForward`) for ``i in indices`` by ``kind`` layers, in place.

    Each replacement is ``ralimp.create(kind, scaled_linear, activation, budget=budget, sample=...)``,
    calibrated on the layer's own inputs (``inputs[i]``, e.g. from `stack_inputs`): RaLiMP fits its
    activation on the pre-activations of that sample (by default ``fit="variance"``, which also chooses the
    number of atoms up to ``num_atoms``); ``sin`` is fitted on the symmetric interval covering them
    (`sine_fit_interval`, for RaLiMP as for EUGen's polynomial and SNNK's Fourier series). With
    ``fit_range = T > 0`` every kind fits any other activation on $[-T, T]$ instead (RaLiMP and EUGen: instead
    of the sample's range; SNNK's Fourier series: instead of $[-4, 4]$).

    Args:
        layers: the stack, applied in order.
        kind: ``"ralimp"``, ``"snnk"`` or ``"eugen"`` (``"dense"`` changes nothing).
        budget: random features per layer (``ralimp.create``'s budget, spent exactly).
        indices: which layers to replace.
        inputs: a sample of each layer's inputs, ``inputs[i]`` of shape ``(n, layers[i].in_features)``.
        poly_degree: ``K`` of RaLiMP and EUGen.
        num_atoms: the most atoms of RaLiMP (its fit chooses ``0..J``).
        num_freqs: Gauss-Laguerre nodes of RaLiMP.
        weight_matrix: ``rf_matrices`` name of the projections.
        balance: RaLiMP's and SNNK's ``balance``: 1 (the paper's layer) or ``"auto"`` (a departure).
        fit_range: half-width ``T`` of the fit interval $[-T, T]$ for activations other than ``sin`` (0:
            the sample's pre-activation range for RaLiMP and EUGen, $[-4, 4]$ for SNNK).
        fit: RaLiMP's fit mode (`FIT_MODES`).
        seed: seed of layer ``i``'s projections is ``seed + i``.

    Returns:
        The indices replaced.
    """
    if kind == DENSE:
        return []
    if not fit_range >= 0:
        raise ValueError(f"fit_range: expected a half-width >= 0 (0: the sample's range), got {fit_range!r}")
    if kind not in SHAPE_OPTIONS:
        raise ValueError(f"kind: expected one of {sorted(SHAPE_OPTIONS)}, got {kind!r}")
    shape = {
        "poly_degree": poly_degree,
        "num_atoms": num_atoms,
        "num_freqs": num_freqs,
        "balance": balance,
        "fit": fit,
    }
    options = {name: shape[name] for name in SHAPE_OPTIONS[kind]}
    bad = [i for i in indices if not 0 <= i < len(layers) or not isinstance(layers[i], FeedForward)]
    if bad:
        raise ValueError(f"indices: {bad} are not FeedForward layers of the stack of {len(layers)}")
    for i in indices:
        layer: FeedForward = layers[i]
        x = inputs[i].detach()
        extra = {}
        if layer.activation_name == "sin":
            activation = torch.sin
            extra["interval"] = sine_fit_interval(layer.preactivation(x).detach())
        else:
            activation = layer.activation_name
            if fit_range > 0:
                extra["interval"] = (-fit_range, fit_range)
        layers[i] = ralimp.create(
            kind,
            layer.scaled_linear(),
            activation,
            budget=budget,
            sample=x,
            weight_matrix=weight_matrix,
            seed=seed + i,
            **options,
            **extra,
        )
    return list(indices)


@torch.no_grad()
def stack_inputs(layers: nn.ModuleList, x: torch.Tensor) -> list[torch.Tensor]:
    """The input of every layer of a plain stack when ``x`` enters the first."""
    inputs = [x]
    for layer in layers[:-1]:
        inputs.append(layer(inputs[-1]))
    return inputs


def inference_parameters(model: nn.Module) -> int:
    """Parameters of the model as deployed: each linearized layer counts its ``Psi(W)`` (``out x F``).

    In eval mode a linearized layer computes ``Phi(x) @ Psi.T`` with ``Psi`` cached, so ``W`` and the fit's
    coefficients are not needed any more; every other parameter counts as it is.
    """
    total = 0
    linearized = [m for m in model.modules() if isinstance(m, ralimp.FeatureLinearization)]
    inside = {id(p) for m in linearized for p in m.parameters()}
    with torch.no_grad():
        for m in linearized:
            total += m.psi().numel()
    total += sum(p.numel() for p in model.parameters() if id(p) not in inside)
    return total
