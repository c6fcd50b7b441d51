"""Configurations of ``nerf-pinn``: one frozen dataclass per subcommand, fields one to one with its flags.

The defaults are the quick CPU settings (a few minutes each); ``configs/*-paper.toml`` hold the
paper-scale settings (the PINN's for a CPU, SIREN's and NeRF's for a GPU:
``nerf-pinn train --family pinn --config configs/pinn-paper.toml``).
Precedence, later winning: the defaults, the TOML file, the flags. The flags shared with the other apps
(``--device``, ``--dtype``, ``--threads``, ``--seed``, ``--steps``, ``--lr``, ``--grad-clip``, ``--layer``,
``--features``, ``--weight-matrix``, ``--out``, ``--resume``) come from ``app_common``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from torch import nn

import ralimp
from app_common.fields import (
    LayerFields,
    OptimizerFields,
    OutputFields,
    RuntimeFields,
    check_int_fields,
    option,
)
from nerf_pinn.layers import DENSE, FIT_MODES, KINDS

REPLACED_LAYERS: dict[str, Callable[[int], list[int]]] = {
    "alternate": lambda depth: list(range(1, depth, 2)),
    "hidden": lambda depth: list(range(1, depth)),
    "all": lambda depth: list(range(depth)),
}
"""``--replace`` -> the indices of the layers to linearize, given the depth."""

REPLACE = tuple(REPLACED_LAYERS)

PRECISIONS = ("float32", "float64")
"""``--precision`` of the PINN."""


def replaced_layers(replace: str, depth: int) -> list[int]:
    """Indices of the layers to linearize: ``alternate`` 1, 3, 5, ...; ``hidden`` 1..depth-1; ``all``."""
    if replace not in REPLACED_LAYERS:
        raise ValueError(f"replace: expected one of {list(REPLACE)}, got {replace!r}")
    return REPLACED_LAYERS[replace](depth)


def _help(text: str, **extra) -> dict:
    return {"help": text, **extra}


@dataclass(frozen=True, kw_only=True)
class CompareConfig(RuntimeFields, OptimizerFields, LayerFields, OutputFields):
    """Settings every family shares: which variants, their feature budget, seed, optimizer, output, resuming.

    A variant's identity (what its checkpoint must match to be resumed, and whose digest ends its run's
    name ``<kind>-s<seed>-<digest>``) is every setting except layer, device, threads, out, resume,
    checkpoint_every, time_repeats, dense_from and the layer settings the variant does not use.
    """

    MAY_CHANGE_ON_RESUME: ClassVar[tuple[str, ...]] = (
        "layer",
        "checkpoint_every",
        "time_repeats",
        "dense_from",
    )

    layer: tuple[str, ...] = option(
        "layer",
        KINDS,
        help="the variants compared (several values)",
        choices=KINDS,
    )
    features: int = option("features", 32)
    poly_degree: int = field(default=2, metadata=_help("K of RaLiMP and EUGen"))
    num_atoms: int = option("num_atoms", 1)
    num_freqs: int = field(
        default=1, metadata=_help("Gauss-Laguerre nodes per atom (1: lowest variance at initialization)")
    )
    replace: str = field(
        default="alternate",
        metadata=_help(
            "layers to linearize: alternate (hidden layers 1, 3, 5, ..., each followed by a dense layer), "
            "hidden (all but the first) or all",
            choices=REPLACE,
        ),
    )
    balance: str = field(
        default="auto",
        metadata=_help(
            "ralimp and snnk: auto (features at x/lambda and lambda w, lambda from |x| and |w|: a departure "
            "from the paper) or a number (1: the paper's layer)"
        ),
    )
    fit_range: float = field(
        default=0.0,
        metadata=_help(
            "half-width T: the kinds fit relu/tanh on [-T, T] (0: ralimp and eugen on the pre-activation "
            "range of the layer's calibration sample, snnk on [-4, 4]; sin always on the sample's range)"
        ),
    )
    fit: str = option("fit", "variance", choices=FIT_MODES)
    seed: int = option("seed", 0)
    lr: float = option("lr", 1e-3, help="Adam")
    grad_clip: float = option("grad_clip", 0.0)
    out: Path = option("out", Path("results/nerf-pinn"))
    checkpoint_every: int = option("checkpoint_every", 200)
    time_repeats: int = field(default=10, metadata=_help("interleaved rounds of the inference timing"))
    dense_from: Path | None = field(
        default=None,
        metadata=_help(
            "the --out folder of another comparison whose finished dense run (same settings) is restored "
            "instead of trained here; it is timed here with the other variants and its folder is left as is"
        ),
    )

    def __post_init__(self) -> None:
        """Known kinds (dense among them), a known replacement rule, positive counts."""
        super().__post_init__()
        unknown = [k for k in self.layer if k not in KINDS]
        if unknown or not self.layer:
            raise ValueError(f"--layer: expected names among {list(KINDS)}, got {list(self.layer)}")
        if DENSE not in self.layer:
            raise ValueError(f"--layer: 'dense' is needed for the time ratio, got {list(self.layer)}")
        if self.replace not in REPLACE:
            raise ValueError(f"--replace: expected one of {list(REPLACE)}, got {self.replace!r}")
        self.balance_value()
        if not self.fit_range >= 0:
            raise ValueError(f"--fit-range: expected a half-width >= 0, got {self.fit_range!r}")
        if self.fit not in FIT_MODES:
            raise ValueError(f"--fit: expected one of {list(FIT_MODES)}, got {self.fit!r}")
        check_int_fields(self, "time_repeats", "num_freqs")
        check_int_fields(self, "checkpoint_every", minimum=0)

    def balance_value(self) -> float | str:
        """``balance`` as ``ralimp.create`` takes it: ``"auto"`` or a positive number."""
        if self.balance == "auto":
            return "auto"
        try:
            value = float(self.balance)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise ValueError(f"--balance: expected auto or a positive number, got {self.balance!r}")
        return value

    def departures(self, kind: str, model: nn.Module) -> list[str]:
        """What variant ``kind``, built as ``model``, does that the paper does not (kept with its results).

        The balance moves only complex-exponential features (SNNK's, RaLiMP's atoms): a RaLiMP model whose
        fits kept no atom does not use it.
        """
        if self.balance_value() != "auto":
            return []
        atoms = any(m.num_atoms for m in model.modules() if isinstance(m, ralimp.RaLiMP))
        if kind == "snnk" or (kind == "ralimp" and atoms):
            return ["balance='auto': features at x/lambda and lambda w (not in the paper)"]
        return []


@dataclass(frozen=True, kw_only=True)
class PinnConfig(CompareConfig):
    """``nerf-pinn pinn``: viscous Burgers (Raissi et al. 2019), dense vs linearized hidden layers.

    Paper scale: 8 hidden layers of 20 tanh units, 100 initial/boundary points, 10,000 collocation points,
    Adam then L-BFGS (``configs/pinn-paper.toml``).
    """

    #: More L-BFGS steps continue a run (its first steps are those of the longer run).
    MAY_CHANGE_ON_RESUME: ClassVar[tuple[str, ...]] = (*CompareConfig.MAY_CHANGE_ON_RESUME, "lbfgs_steps")

    out: Path = option("out", Path("results/nerf-pinn/pinn"))
    depth: int = field(default=8, metadata=_help("hidden layers"))
    width: int = field(default=20, metadata=_help("units per hidden layer"))
    num_boundary: int = field(default=100, metadata=_help("initial and boundary points"))
    num_collocation: int = field(default=1000, metadata=_help("collocation points of the residual"))
    steps: int = option("steps", 1000, help="Adam steps (L-BFGS follows)")
    lbfgs_steps: int = field(default=30, metadata=_help("L-BFGS-B steps after Adam (checkpointed between)"))
    lbfgs_iterations: int = field(default=20, metadata=_help("L-BFGS-B iterations per step (a fresh memory)"))
    lbfgs_tolerance_grad: float = field(
        default=1e-7, metadata=_help("L-BFGS-B stops once the largest gradient entry is at most this (gtol)")
    )
    lbfgs_tolerance_change: float = field(
        default=1e-9, metadata=_help("L-BFGS-B stops once the loss changes relatively by at most this (ftol)")
    )
    quadrature_nodes: int = field(default=100, metadata=_help("Gauss-Hermite nodes of the reference"))
    precision: str = field(
        default="float32",
        metadata=_help(
            "the PINN's parameters, points and derivatives: float32 or float64",
            choices=PRECISIONS,
        ),
    )

    def __post_init__(self) -> None:
        """The shared checks, a positive ``lbfgs_iterations`` and a known precision."""
        super().__post_init__()
        check_int_fields(self, "lbfgs_iterations")
        if self.precision not in PRECISIONS:
            raise ValueError(f"--precision: expected one of {list(PRECISIONS)}, got {self.precision!r}")


@dataclass(frozen=True, kw_only=True)
class SirenConfig(CompareConfig):
    """``nerf-pinn siren``: SIREN (omega_0 = 30) fitting scikit-image's ``camera``, PSNR.

    Hidden sine layers are linearized (``--replace``); the first layer (``sin(30 (W x + b))`` of the
    coordinates, the network's Fourier encoding, pre-activations up to about 30) stays dense unless
    ``--replace all``. Paper scale: 256 x 256 pixels, 5 layers of 256 units
    (``configs/siren-paper.toml``).
    """

    out: Path = option("out", Path("results/nerf-pinn/siren"))
    image: Path | None = field(default=None, metadata=_help("an image file (default: skimage's camera)"))
    size: int = field(default=96, metadata=_help("the image is resized to size x size"))
    depth: int = field(default=4, metadata=_help("sine layers (the first one included)"))
    width: int = field(default=64, metadata=_help("units per layer"))
    omega_0: float = field(default=30.0, metadata=_help("SIREN's frequency factor"))
    steps: int = option("steps", 400, help="Adam steps (full batch)")


@dataclass(frozen=True, kw_only=True)
class NerfConfig(CompareConfig):
    """``nerf-pinn nerf``: NeRF on posed images, PSNR on held-out views.

    ``--data`` is a Blender synthetic scene folder (``transforms_{train,val,test}.json``), a
    ``tiny_nerf_data.npz`` file, or empty for the scene the package renders itself. Paper scale: 8 layers of
    256 with the skip at layer 4, view directions, 64 samples per ray (``configs/nerf-paper.toml``).
    """

    out: Path = option("out", Path("results/nerf-pinn/nerf"))
    weight_matrix: str = option(
        "weight_matrix",
        "orf",
        help="orf here: orthogonal projections, a RaLiMP NeRF far less seed-dependent than with base",
    )
    num_atoms: int = option(
        "num_atoms",
        0,
        help="0 here, the polynomial block only: an atom's variance grows exponentially with the layer's "
        "inputs, and the trunk's pre-activations grow up to 35x in training",
    )
    fit_range: float = field(
        default=4.0,
        metadata=_help(
            "half-width T of the relu fit [-T, T] (0: the calibration sample's range; the trunk's "
            "pre-activations grow up to 35x in training, far beyond the range they start in)"
        ),
    )
    fit: str = option(
        "fit",
        "discretized",
        help="discretized here: the variance-aware fit weighs the variance at the initial pre-activations "
        "and shrinks the quadratic term the trunk trains against",
        choices=FIT_MODES,
    )
    data: Path | None = field(
        default=None, metadata=_help("Blender folder or tiny_nerf npz (default: synthetic)")
    )
    image_size: int = field(default=32, metadata=_help("synthetic scene: image height and width"))
    num_views: int = field(default=40, metadata=_help("synthetic scene: views (the last 4 held out)"))
    downscale: int = field(default=1, metadata=_help("Blender: integer factor the images are reduced by"))
    depth: int = field(default=4, metadata=_help("layers of the trunk"))
    width: int = field(default=64, metadata=_help("units per trunk layer"))
    skip: int = field(default=-1, metadata=_help("trunk layer whose input is concatenated with the encoding"))
    pos_freqs: int = field(default=6, metadata=_help("positional-encoding frequencies of x"))
    dir_freqs: int = field(default=0, metadata=_help("frequencies of the view direction (0: no view input)"))
    samples: int = field(default=32, metadata=_help("stratified samples per ray"))
    near: float | None = field(default=None, metadata=_help("near bound (default: the data's)"))
    far: float | None = field(default=None, metadata=_help("far bound (default: the data's)"))
    batch_rays: int = field(default=256, metadata=_help("rays per step"))
    steps: int = option("steps", 1200, help="Adam steps")
    eval_views: int = field(default=4, metadata=_help("held-out views rendered for PSNR"))


#: ``--family`` -> its configuration.
FAMILIES: dict[str, type[CompareConfig]] = {"pinn": PinnConfig, "siren": SirenConfig, "nerf": NerfConfig}
