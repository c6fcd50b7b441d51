"""The feed-forward layer of every coordinate network, and its linearized replacements from ``ralimp``.

Every network here is a stack of `FeedForward` layers ``activation(scale * (W x + b))`` (tanh for
the PINN, ``sin`` with ``scale = omega_0`` for SIREN, relu for NeRF) followed by plain ``nn.Linear`` heads.
`linearize` swaps chosen layers for a ``ralimp`` layer of the registered kind (``ralimp``, ``snnk``,
``eugen``) built by ``from_linear`` from the layer's own weights (``scale`` folded into ``W, b``), with the
same feature budget (`layer_options`), so the kinds are compared at equal numbers of random features.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn

import ralimp

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


def _ralimp_options(budget: int, *, poly_degree: int, num_atoms: int, num_freqs: int) -> dict:
    per_node = 2 * num_atoms * num_freqs
    freq_features = max(1, round(0.75 * budget / per_node)) if num_atoms else 1
    poly_features = budget - per_node * freq_features if num_atoms else budget
    if poly_features < 1:
        raise ValueError(
            f"features: {budget} is below RaLiMP's smallest budget 1 + 2 J n_freq = {1 + per_node} "
            f"(num_atoms={num_atoms}, num_freqs={num_freqs})"
        )
    return {
        "poly_degree": poly_degree,
        "poly_features": poly_features,
        "num_atoms": num_atoms,
        "num_freqs": num_freqs,
        "freq_features": freq_features,
    }


def _eugen_options(budget: int, *, poly_degree: int, num_atoms: int, num_freqs: int) -> dict:
    return {"poly_degree": poly_degree, "num_features": budget}


def _snnk_options(budget: int, *, poly_degree: int, num_atoms: int, num_freqs: int) -> dict:
    return {"num_features": budget}


BUDGETS: dict[str, Callable[..., dict]] = {
    "ralimp": _ralimp_options,
    "eugen": _eugen_options,
    "snnk": _snnk_options,
}
"""Layer kind -> the constructor options spending a feature budget (a kind added to ``ralimp`` adds one)."""


def layer_options(kind: str, budget: int, *, poly_degree: int, num_atoms: int, num_freqs: int) -> dict:
    """Constructor options of ``kind`` giving ``budget`` random features as the paper counts them.

    RaLiMP counts ``m_poly + 2 J n_freq m`` (App. D.1: ``8 + 2 * 1 * 3 * 4 = 32``): about a quarter of the
    budget goes to the polynomial block and the rest to the atoms. EUGen and SNNK count their ``m``.
    """
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 2:
        raise ValueError(f"features: expected an integer >= 2, got {budget!r}")
    if kind not in BUDGETS:
        raise ValueError(f"kind: expected one of {sorted(BUDGETS)}, got {kind!r}")
    return BUDGETS[kind](budget, poly_degree=poly_degree, num_atoms=num_atoms, num_freqs=num_freqs)


def sine_fit_interval(t: torch.Tensor, *, margin: float = 1.1, minimum: float = 1.0) -> tuple[float, float]:
    """The symmetric interval ``[-T, T]`` covering the pre-activations ``t`` (with a margin)."""
    half = max(float(t.detach().abs().max()) * margin, minimum)
    return (-half, half)


def linearize(
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
    seed: int = 0,
) -> list[int]:
    """Replace ``layers[i]`` (a `FeedForward`) for ``i in indices`` by ``kind`` layers, in place.

    Each replacement is ``ralimp.LAYERS.get(kind).from_linear(scaled_linear, activation, sample=...)``,
    calibrated on the layer's own inputs (``inputs[i]``, e.g. from `stack_inputs`). Registered
    activations (tanh, relu) use ``ralimp``'s fits on ``[-4, 4]``; ``sin`` is fitted on the range of the
    layer's pre-activations over the sample (`sine_fit_interval`, RaLiMP by ``fit_rational``,
    EUGen's polynomial and SNNK's Fourier series on the same interval).

    Args:
        layers: the stack, applied in order.
        kind: ``"ralimp"``, ``"snnk"`` or ``"eugen"`` (``"dense"`` changes nothing).
        budget: random features per layer (`layer_options`).
        indices: which layers to replace.
        inputs: a sample of each layer's inputs, ``inputs[i]`` of shape ``(n, layers[i].in_features)``.
        poly_degree: ``K`` of RaLiMP and EUGen.
        num_atoms: ``J`` of RaLiMP.
        num_freqs: Gauss-Laguerre nodes of RaLiMP.
        weight_matrix: ``rf_matrices`` name of the projections.
        seed: seed of layer ``i``'s projections is ``seed + i``.

    Returns:
        The indices replaced.
    """
    if kind == DENSE:
        return []
    options = layer_options(kind, budget, poly_degree=poly_degree, num_atoms=num_atoms, num_freqs=num_freqs)
    bad = [i for i in indices if not 0 <= i < len(layers) or not isinstance(layers[i], FeedForward)]
    if bad:
        raise ValueError(f"indices: {bad} are not FeedForward layers of the stack of {len(layers)}")
    cls = ralimp.LAYERS.get(kind)
    for i in indices:
        layer: FeedForward = layers[i]
        x = inputs[i].detach()
        extra = {}
        if layer.activation_name == "sin":
            activation = torch.sin
            extra["interval"] = sine_fit_interval(layer.preactivation(x).detach())
        else:
            activation = layer.activation_name
        layers[i] = cls.from_linear(
            layer.scaled_linear(),
            activation,
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


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters (random projection matrices are buffers: they are regenerated from the seed)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


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


@torch.no_grad()
def time_inference(
    models: dict[str, nn.Module],
    run: Callable[[nn.Module], object],
    *,
    repeats: int = 5,
    device: torch.device | None = None,
) -> dict[str, float]:
    """Median seconds of ``run(model)`` for each model, the models interleaved in every round.

    Interleaving makes the ratios between models robust to a load that drifts during the measurement
    (a shared CPU). One warm-up round is not counted. Models are put in eval mode (RaLiMP caches ``Psi``).
    """
    for model in models.values():
        model.eval()
    times: dict[str, list[float]] = {name: [] for name in models}
    for round_ in range(repeats + 1):
        for name, model in models.items():
            if device is not None and device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            run(model)
            if device is not None and device.type == "cuda":
                torch.cuda.synchronize(device)
            if round_:
                times[name].append(time.perf_counter() - start)
    return {name: sorted(v)[len(v) // 2] for name, v in times.items()}
