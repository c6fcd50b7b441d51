"""Configurations of ``nerf-pinn``: one frozen dataclass per subcommand, fields one to one with its flags.

The defaults are the quick CPU settings (a few minutes each); ``configs/*-paper.toml`` hold the paper-scale
settings for a GPU (``nerf-pinn pinn --config configs/pinn-paper.toml``). Precedence, later winning: the
defaults, the TOML file, the flags.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from app_common import DEVICES
from nerf_pinn.layers import KINDS

REPLACED_LAYERS: dict[str, Callable[[int], list[int]]] = {
    "alternate": lambda depth: list(range(1, depth, 2)),
    "hidden": lambda depth: list(range(1, depth)),
    "all": lambda depth: list(range(depth)),
}
"""``--replace`` -> the indices of the layers to linearize, given the depth."""

REPLACE = tuple(REPLACED_LAYERS)


def replaced_layers(replace: str, depth: int) -> list[int]:
    """Indices of the layers to linearize: ``alternate`` 1, 3, 5, ...; ``hidden`` 1..depth-1; ``all``."""
    if replace not in REPLACED_LAYERS:
        raise ValueError(f"replace: expected one of {list(REPLACE)}, got {replace!r}")
    return REPLACED_LAYERS[replace](depth)


def _help(text: str, **extra) -> dict:
    return {"help": text, **extra}


@dataclass(frozen=True)
class CompareConfig:
    """Settings every family shares: which variants, their feature budget, seeds, output, resuming."""

    kinds: tuple[str, ...] = field(default=KINDS, metadata=_help("variants to compare", choices=KINDS))
    features: int = field(default=32, metadata=_help("random features per linearized layer (equal budget)"))
    poly_degree: int = field(default=2, metadata=_help("K of RaLiMP and EUGen"))
    num_atoms: int = field(default=1, metadata=_help("J, the atoms of RaLiMP's rational fit"))
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
    weight_matrix: str = field(default="base", metadata=_help("rf_matrices name of the projections"))
    seed: int = field(default=0, metadata=_help("seed of the data, the initialization and the projections"))
    device: str = field(default="auto", metadata=_help("auto, cpu, cuda or cuda:N"))
    out: Path = field(default=Path("results/nerf-pinn"), metadata=_help("output folder of the family"))
    resume: bool = field(default=True, metadata=_help("continue from checkpoints and finished variants"))
    checkpoint_every: int = field(default=200, metadata=_help("optimizer steps between checkpoints"))
    threads: int = field(default=0, metadata=_help("torch CPU threads (0: torch's default)"))
    time_repeats: int = field(default=10, metadata=_help("interleaved rounds of the inference timing"))

    def __post_init__(self) -> None:
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown or not self.kinds:
            raise ValueError(f"kinds: expected names among {list(KINDS)}, got {list(self.kinds)}")
        if "dense" not in self.kinds:
            raise ValueError(f"kinds: 'dense' is needed for the time ratio, got {list(self.kinds)}")
        if self.device not in DEVICES and not self.device.startswith("cuda:"):
            raise ValueError(f"device: expected one of {list(DEVICES)} or cuda:N, got {self.device!r}")
        if self.replace not in REPLACE:
            raise ValueError(f"replace: expected one of {list(REPLACE)}, got {self.replace!r}")
        if self.threads < 0:
            raise ValueError(f"threads: expected 0 (torch's default) or a positive count, got {self.threads}")
        for name in ("features", "checkpoint_every", "time_repeats", "num_freqs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected a positive integer, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class PinnConfig(CompareConfig):
    """``nerf-pinn pinn``: viscous Burgers (Raissi et al. 2019), dense vs linearized hidden layers.

    Paper scale: 8 hidden layers of 20 tanh units, 100 initial/boundary points, 10,000 collocation points,
    Adam then L-BFGS (``configs/pinn-paper.toml``).
    """

    out: Path = field(default=Path("results/nerf-pinn/pinn"), metadata=_help("output folder"))
    depth: int = field(default=8, metadata=_help("hidden layers"))
    width: int = field(default=20, metadata=_help("units per hidden layer"))
    num_boundary: int = field(default=100, metadata=_help("initial and boundary points"))
    num_collocation: int = field(default=1000, metadata=_help("collocation points of the residual"))
    adam_steps: int = field(default=1000, metadata=_help("Adam steps"))
    learning_rate: float = field(default=1e-3, metadata=_help("Adam learning rate"))
    lbfgs_steps: int = field(default=30, metadata=_help("L-BFGS steps after Adam (each up to 20 iterations)"))
    quadrature_nodes: int = field(default=100, metadata=_help("Gauss-Hermite nodes of the reference"))


@dataclass(frozen=True)
class SirenConfig(CompareConfig):
    """``nerf-pinn siren``: SIREN (omega_0 = 30) fitting scikit-image's ``camera``, PSNR.

    Hidden sine layers are linearized (``--replace``); the first layer (``sin(30 (W x + b))`` of the
    coordinates, the network's Fourier encoding, pre-activations up to about 30) stays dense unless
    ``--replace all``. Paper scale: 256 x 256 pixels, 5 layers of 256 units
    (``configs/siren-paper.toml``).
    """

    out: Path = field(default=Path("results/nerf-pinn/siren"), metadata=_help("output folder"))
    image: Path | None = field(default=None, metadata=_help("an image file (default: skimage's camera)"))
    size: int = field(default=96, metadata=_help("the image is resized to size x size"))
    depth: int = field(default=4, metadata=_help("sine layers (the first one included)"))
    width: int = field(default=64, metadata=_help("units per layer"))
    omega_0: float = field(default=30.0, metadata=_help("SIREN's frequency factor"))
    steps: int = field(default=400, metadata=_help("Adam steps (full batch)"))
    learning_rate: float = field(default=1e-3, metadata=_help("Adam learning rate"))


@dataclass(frozen=True)
class NerfConfig(CompareConfig):
    """``nerf-pinn nerf``: NeRF on posed images, PSNR on held-out views.

    ``--data`` is a Blender synthetic scene folder (``transforms_{train,val,test}.json``), a
    ``tiny_nerf_data.npz`` file, or empty for the scene the package renders itself. Paper scale: 8 layers of
    256 with the skip at layer 4, view directions, 64 samples per ray (``configs/nerf-paper.toml``).
    """

    out: Path = field(default=Path("results/nerf-pinn/nerf"), metadata=_help("output folder"))
    features: int = field(default=32, metadata=_help("random features per linearized layer (equal budget)"))
    num_atoms: int = field(default=1, metadata=_help("J of RaLiMP (relu: J >= 2 floors narrow poles)"))
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
    steps: int = field(default=1200, metadata=_help("Adam steps"))
    learning_rate: float = field(default=1e-3, metadata=_help("Adam learning rate"))
    eval_views: int = field(default=4, metadata=_help("held-out views rendered for PSNR"))
