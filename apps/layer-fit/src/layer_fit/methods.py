"""The methods of the fit at a feature budget, each made by ``ralimp.create``, as a registry.

Each builder takes ``(linear, activation, budget, *, seed, sample, balance, weight_matrix)`` and returns a
module mapping
``(..., dim)`` to ``(..., dim)``, initialized from ``linear`` (the same seeded, untrained ``nn.Linear`` for
every method). ``ralimp.create`` spends the budget ``B`` exactly (``num_random_features == B``, the
paper's counting; table in the RaLiMP guide):

- ``lowrank``: ``f(U V x + b)``, rank ``B``, the activation applied exactly;
- ``eugen``: EUGen of degree 2 with ``B`` rows per projection;
- ``snnk``: SNNK (Fourier variant), ``B`` complex projections;
- ``ralimp``: RaLiMP with ``K = 2``, one atom at 3 Gauss-Laguerre nodes, ``tau = 1`` (App. D.1): at
  ``B = 32`` 8 polynomial + 2 x 3 x 4 = 24 rational features;
- ``ralimp-paper``: the same RaLiMP as the paper writes it: its start, ``fit="paper"`` (one atom whatever its
  variance; ``ralimp`` keeps the atom only where the variance-aware fit finds it pays), and no exponent
  guard (``exponent_guard=False``: features that overflow give ``inf``/``NaN``, which the run records as
  diverged, instead of an error before the first step);
- ``ralimp-psi``: the same RaLiMP, compressed at initialization with an identity following layer
  (``layer.compress``, App. B), so that training updates ``Psi`` itself on the frozen ``Phi(x)``, as
  EUGen and SNNK do (``ralimp`` trains ``W, b``, which sit in the exponent of the features);
- ``ralimp-omega`` (and ``eugen-omega``, ``snnk-omega``, its controls): the method with its random
  projections trained too (each projection matrix's rows a parameter): a reading no text of the paper
  supports (App. C.2 puts "all randomness in a RaLiMP" in the projections), run to test whether trained
  projections explain Fig. 2's ordering; only these move ``Phi(x)``, so only these can go below the
  information floor of their initial features;
- ``linear`` (not in the paper's figure): a rank-``B`` linear map ``U V x + b`` (LowRank with the
  identity as activation).

``balance`` goes to RaLiMP and SNNK (``"auto"``, a departure, or 1, the paper's layer); ``weight_matrix``
(the ``rf_matrices`` name of the random projections, ``--weight-matrix``) to RaLiMP, EUGen and SNNK (low-rank
and linear draw none).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

import ralimp
from spectraformer_core import Registry

Builder = Callable[..., nn.Module]

#: Method name -> builder ``(linear, activation, budget, *, seed, sample, balance, weight_matrix)``;
#: ``METHODS.register("name")(builder)`` adds one.
METHODS: Registry[Builder] = Registry("method")

#: RaLiMP's shape in the paper's single-layer fit (App. D.1: at most one atom, 3 nodes, tau = 1), started
#: by the variance-aware fit (which may choose no atom; the paper's own start, ``fit="paper"``, has a bound
#: on its estimators' log second moment above float32's range at width 256 and runs unguarded in
#: ``ralimp-paper``, where that variance shows); the budget sets the feature counts.
RALIMP_SHAPE = {"poly_degree": 2, "num_atoms": 1, "num_freqs": 3, "tau": 1.0, "fit": "variance"}


@METHODS.register("lowrank")
def build_lowrank(
    linear: nn.Linear, activation: str, budget: int, *, seed: int, sample, balance, weight_matrix
):
    """``f(U V x + b)``, rank ``budget``, from the truncated SVD of ``linear``."""
    return ralimp.create("lowrank", linear, activation, budget=budget, seed=seed)


@METHODS.register("eugen")
def build_eugen(
    linear: nn.Linear, activation: str, budget: int, *, seed: int, sample, balance, weight_matrix
):
    """EUGen of degree 2 with ``budget`` rows per projection, its polynomial fitted on ``sample``'s range."""
    return ralimp.create(
        "eugen",
        linear,
        activation,
        budget=budget,
        seed=seed,
        sample=sample,
        poly_degree=2,
        weight_matrix=weight_matrix,
    )


@METHODS.register("snnk")
def build_snnk(linear: nn.Linear, activation: str, budget: int, *, seed: int, sample, balance, weight_matrix):
    """SNNK (Fourier variant) with ``budget`` projections; ``balance`` calibrated on ``sample``."""
    return ralimp.create(
        "snnk",
        linear,
        activation,
        budget=budget,
        seed=seed,
        sample=sample,
        balance=balance,
        weight_matrix=weight_matrix,
    )


@METHODS.register("ralimp")
def build_ralimp(
    linear: nn.Linear, activation: str, budget: int, *, seed: int, sample, balance, weight_matrix
):
    """RaLiMP of `RALIMP_SHAPE` spending ``budget``; ``balance`` calibrated on ``sample``."""
    return _ralimp(linear, activation, budget, seed, sample, balance, weight_matrix, RALIMP_SHAPE)


@METHODS.register("ralimp-paper")
def build_ralimp_paper(
    linear: nn.Linear, activation: str, budget: int, *, seed: int, sample, balance, weight_matrix
):
    """RaLiMP of `RALIMP_SHAPE` with the paper's fit (``fit="paper"``: its one atom kept), unguarded."""
    shape = RALIMP_SHAPE | {"fit": "paper", "exponent_guard": False}
    return _ralimp(linear, activation, budget, seed, sample, balance, weight_matrix, shape)


def _ralimp(linear, activation, budget, seed, sample, balance, weight_matrix, shape):
    """``ralimp.create("ralimp", ...)`` with a method's arguments and its ``shape`` (sizes, fit options)."""
    return ralimp.create(
        "ralimp",
        linear,
        activation,
        budget=budget,
        seed=seed,
        sample=sample,
        balance=balance,
        weight_matrix=weight_matrix,
        **shape,
    )


@METHODS.register("ralimp-psi")
def build_ralimp_psi(
    linear: nn.Linear, activation: str, budget: int, *, seed: int, sample, balance, weight_matrix
):
    """``build_ralimp`` compressed with the identity: a trainable ``Psi (out, F)`` on a frozen ``Phi``."""
    layer = build_ralimp(
        linear, activation, budget, seed=seed, sample=sample, balance=balance, weight_matrix=weight_matrix
    )
    eye = nn.Linear(linear.out_features, linear.out_features, bias=False, device=linear.weight.device)
    with torch.no_grad():
        eye.weight.copy_(torch.eye(linear.out_features))
    return layer.compress(eye)


def train_projections(layer: nn.Module) -> nn.Module:
    """``layer`` with the rows of every dense random projection matrix in it made a trainable parameter.

    A dense projection matrix (``rf_matrices.DenseWeightMatrix``) holds its drawn rows as the buffer
    ``weight``; each becomes an ``nn.Parameter`` of the same name (the same ``state_dict`` key, the same
    draws). A layer without one is an error.
    """
    matrices = [m for m in layer.modules() if "weight" in dict(m.named_buffers(recurse=False))]
    if not matrices:
        kind = type(layer).__name__
        raise ValueError(f"layer: expected dense random projection matrices in {kind}, found none")
    for matrix in matrices:
        rows = matrix.weight.detach().clone()
        del matrix.weight  # the buffer, replaced by a parameter of the same name
        matrix.weight = nn.Parameter(rows)
    return layer


def _with_trained_projections(builder: Builder, name: str) -> Builder:
    def build(linear: nn.Linear, activation: str, budget: int, *, seed: int, sample, balance, weight_matrix):
        layer = builder(
            linear, activation, budget, seed=seed, sample=sample, balance=balance, weight_matrix=weight_matrix
        )
        return train_projections(layer)

    build.__doc__ = f"``{name}`` with its random projections trained too (`train_projections`)."
    return build


#: ``<method>-omega``: the method with its random projections trained too (`train_projections`).
for _name, _builder in (("ralimp", build_ralimp), ("eugen", build_eugen), ("snnk", build_snnk)):
    METHODS.register(f"{_name}-omega")(_with_trained_projections(_builder, _name))


def equal_width(budget: int) -> int:
    """``F = 2 B + 1``: the width of the equal-width methods at budget ``B`` (EUGen's, paper count)."""
    return 2 * budget + 1


def _width_builder(kind: str, shape: dict[str, object]) -> Builder:
    def build(linear: nn.Linear, activation: str, budget: int, *, seed: int, sample, balance, weight_matrix):
        projections = {} if kind == "lowrank" else {"weight_matrix": weight_matrix}
        return ralimp.create(
            kind,
            linear,
            activation,
            budget=equal_width(budget),
            count="width",
            seed=seed,
            sample=sample,
            **shape,
            **projections,
        )

    build.__doc__ = f"``{kind}`` whose feature width (``feature_dim``, rank for low-rank) is ``2 B + 1``."
    return build


#: The equal-width comparison: every method at the same width ``F = 2 B + 1`` (`equal_width`), where the
#: paper's count gives RaLiMP ``F = 41``, EUGen 65, low-rank rank 32 at ``B = 32``. SNNK's widths are even, so
#: it has none.
for _kind, _shape in (
    ("ralimp", RALIMP_SHAPE),
    ("eugen", {"poly_degree": 2}),
    ("lowrank", {}),
):
    METHODS.register(f"{_kind}-width")(_width_builder(_kind, _shape))


def identity(t: torch.Tensor) -> torch.Tensor:
    """``t``."""
    return t


@METHODS.register("linear")
def build_linear(
    linear: nn.Linear, activation: str, budget: int, *, seed: int, sample, balance, weight_matrix
):
    """A rank-``budget`` linear map ``U V x + b`` (no activation), from the truncated SVD of ``linear``."""
    return ralimp.create("lowrank", linear, identity, budget=budget, seed=seed)


class FitModel(nn.Module):
    """``scale * layer(x) + shift`` per output column (or ``layer(x)`` alone without ``output_affine``).

    The targets are standardized per column; a shared head lets every method match each column's scale,
    which ``LowRank`` (whose outputs lie in the range of ``f``) and ``RaLiMP`` (one rational function
    for all units) could not otherwise do. The head is a departure from the paper (``--paper-literal``
    turns it off).
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
    balance: float | str = "auto",
    output_affine: bool = True,
    weight_matrix: str = "base",
    device: torch.device | str = "cpu",
) -> FitModel:
    """The model of one run: ``method`` at ``budget`` from a dense ``nn.Linear(dim, dim)`` seeded by ``seed``.

    The dense layer has PyTorch's default initialization under ``torch.manual_seed(seed)``; the method's
    own random projections (``weight_matrix``) are drawn from ``seed`` too.
    """
    builder = METHODS.get(method)
    torch.manual_seed(seed)
    linear = nn.Linear(dim, dim, device=device)
    layer = builder(
        linear, activation, budget, seed=seed, sample=sample, balance=balance, weight_matrix=weight_matrix
    )
    return FitModel(layer.to(device), dim, output_affine=output_affine)
