"""The methods of the fit at a feature budget, built from ``ralimp``'s constructors, as a registry.

Each builder takes ``(linear, activation, budget, *, seed, sample)`` and returns a module mapping
``(..., dim)`` to ``(..., dim)``, initialized from ``linear`` (the same seeded, untrained ``nn.Linear`` for
every method) with ``from_linear``. Budget ``B`` maps onto the constructors as the paper counts it:

- ``lowrank``: ``ralimp.LowRank(rank=B)``, ``f(U V x + b)`` with the activation applied exactly;
- ``eugen``: ``ralimp.EUGen(poly_degree=2, num_features=B)``;
- ``snnk``: ``ralimp.SNNK(num_features=B)`` (Fourier variant, ``B`` complex projections);
- ``ralimp``: ``ralimp.RaLiMP(poly_degree=2, poly_features=B/4, num_atoms=1, num_freqs=3,
  freq_features=B/8, tau=1)``: ``B/4 + 2 * 1 * 3 * B/8 = B`` (``B = 32``: 8 polynomial + 24 rational
  features, 3 frequencies x m = 4, one atom; the shipped fits' single atom is centered, ``p = 0``);
- ``ralimp-psi``: the same RaLiMP, compressed at initialization with an identity following layer
  (``layer.compress``, App. B), so that training updates ``Psi`` itself on the frozen ``Phi(x)``, as the
  package's EUGen and SNNK do (``ralimp`` trains ``W, b``, which sit in the exponent of the features);
- ``linear`` (not in the paper's figure): ``ralimp.LowRank(rank=B)`` with the identity as activation, a
  purely linear rank-``B`` map.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

import ralimp
from spectraformer_core import Registry

Builder = Callable[..., nn.Module]

#: Method name -> builder ``(linear, activation, budget, *, seed, sample) -> nn.Module``;
#: ``METHODS.register("name")(builder)`` adds one.
METHODS: Registry[Builder] = Registry("method")


@METHODS.register("lowrank")
def build_lowrank(linear: nn.Linear, activation: str, budget: int, *, seed: int, sample: torch.Tensor):
    """``f(U V x + b)``, rank ``budget``, from the truncated SVD of ``linear``."""
    return ralimp.LowRank.from_linear(linear, activation, rank=budget, seed=seed)


@METHODS.register("eugen")
def build_eugen(linear: nn.Linear, activation: str, budget: int, *, seed: int, sample: torch.Tensor):
    """EUGen of degree 2 with ``budget`` rows per projection."""
    return ralimp.EUGen.from_linear(linear, activation, poly_degree=2, num_features=budget, seed=seed)


@METHODS.register("snnk")
def build_snnk(linear: nn.Linear, activation: str, budget: int, *, seed: int, sample: torch.Tensor):
    """SNNK (Fourier variant) with ``budget`` projections, balanced on ``sample``."""
    return ralimp.SNNK.from_linear(linear, activation, num_features=budget, seed=seed, sample=sample)


def ralimp_split(budget: int) -> tuple[int, int]:
    """``(poly_features, freq_features)`` of a RaLiMP with budget ``B``: ``B/4`` and ``B/8`` (``B % 8 == 0``).

    One atom at 3 Gauss-Laguerre nodes spends ``2 * 3 * freq_features`` features (real and imaginary parts),
    so ``B/4 + 6 B/8 = B``: the paper's 8 + 24 at ``B = 32``.
    """
    if budget % 8 or budget < 8:
        raise ValueError(
            f"budget: RaLiMP splits B into B/4 + 6 * B/8, expected a multiple of 8, got {budget}"
        )
    return budget // 4, budget // 8


@METHODS.register("ralimp")
def build_ralimp(linear: nn.Linear, activation: str, budget: int, *, seed: int, sample: torch.Tensor):
    """RaLiMP, K = 2 with ``B/4`` features, one atom at 3 nodes x ``B/8`` projections, ``tau = 1``."""
    poly, freq = ralimp_split(budget)
    return ralimp.RaLiMP.from_linear(
        linear,
        activation,
        poly_degree=2,
        poly_features=poly,
        num_atoms=1,
        num_freqs=3,
        freq_features=freq,
        tau=1.0,
        seed=seed,
        sample=sample,
    )


@METHODS.register("ralimp-psi")
def build_ralimp_psi(linear: nn.Linear, activation: str, budget: int, *, seed: int, sample: torch.Tensor):
    """`build_ralimp` compressed with the identity: a trainable ``Psi (out, F)`` on a frozen ``Phi``."""
    layer = build_ralimp(linear, activation, budget, seed=seed, sample=sample)
    eye = nn.Linear(linear.out_features, linear.out_features, bias=False, device=linear.weight.device)
    with torch.no_grad():
        eye.weight.copy_(torch.eye(linear.out_features))
    return layer.compress(eye)


def identity(t: torch.Tensor) -> torch.Tensor:
    """``t``."""
    return t


@METHODS.register("linear")
def build_linear(linear: nn.Linear, activation: str, budget: int, *, seed: int, sample: torch.Tensor):
    """A rank-``budget`` linear map ``U V x + b`` (no activation), from the truncated SVD of ``linear``."""
    return ralimp.LowRank.from_linear(linear, identity, rank=budget, seed=seed)


class FitModel(nn.Module):
    """``scale * layer(x) + shift`` per output column (or ``layer(x)`` alone without ``output_affine``).

    The targets are standardized per column; a shared head lets every method match each column's scale,
    which ``LowRank`` (whose outputs lie in the range of ``f``) and ``RaLiMP`` (one rational function
    for all units) could not otherwise do.
    """

    def __init__(self, layer: nn.Module, out_features: int, *, output_affine: bool = True) -> None:
        super().__init__()
        self.layer = layer
        self.output_affine = output_affine
        if output_affine:
            factory = {"device": next(layer.parameters()).device}
            self.scale = nn.Parameter(torch.ones(out_features, **factory))
            self.shift = nn.Parameter(torch.zeros(out_features, **factory))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., dim)`` -> ``(..., out_features)``."""
        y = self.layer(x)
        return y * self.scale + self.shift if self.output_affine else y


def build(
    method: str,
    activation: str,
    budget: int,
    *,
    dim: int,
    seed: int,
    sample: torch.Tensor,
    output_affine: bool = True,
    device: torch.device | str = "cpu",
) -> FitModel:
    """The model of one run: ``method`` at ``budget`` from a dense ``nn.Linear(dim, dim)`` seeded by ``seed``.

    The dense layer has PyTorch's default initialization under ``torch.manual_seed(seed)``; the method's
    own random projections are drawn from ``seed`` too.
    """
    builder = METHODS.get(method)
    torch.manual_seed(seed)
    linear = nn.Linear(dim, dim, device=device)
    layer = builder(linear, activation, budget, seed=seed, sample=sample)
    return FitModel(layer.to(device), dim, output_affine=output_affine)
