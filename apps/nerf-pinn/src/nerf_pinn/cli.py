"""``nerf-pinn``: coordinate networks with linearized MLPs (RaLiMP, SNNK, EUGen) against the dense MLP.

Subcommands:

- ``pinn``: a PINN for viscous Burgers, relative L2 error against the Cole-Hopf reference;
- ``siren``: SIREN fitting an image (scikit-image's ``camera``), PSNR;
- ``nerf``: NeRF on posed images (Blender folder, tiny_nerf npz, or the offline synthetic scene), PSNR;
- ``scene``: render the offline synthetic scene to an npz file (the tiny_nerf format);
- ``burgers-check``: compare the reference solution with a ``burgers_shock.mat`` file.

Every family trains each variant, then times the inference of all of them in the same run; results go to
``<out>/results.jsonl``, ``<out>/results.md`` and PNG plots. Every setting is a flag and a key of the TOML
file given with ``--config`` (the paper-scale settings ship in the app's ``configs/``); flags win.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import app_common as ac
from nerf_pinn.config import NerfConfig, PinnConfig, SirenConfig


@dataclass(frozen=True)
class SceneConfig:
    """``nerf-pinn scene``: render the offline synthetic scene (analytic shapes) to an npz file."""

    out: Path = field(default=Path("results/nerf-pinn/synthetic_scene.npz"), metadata={"help": "npz path"})
    num_views: int = field(default=40, metadata={"help": "views"})
    size: int = field(default=32, metadata={"help": "image height and width"})
    seed: int = field(default=0, metadata={"help": "seed of the azimuth jitter"})


@dataclass(frozen=True)
class CheckConfig:
    """``nerf-pinn burgers-check``: relative L2 difference of the reference and a burgers_shock.mat file."""

    mat: Path = field(metadata={"help": "path of burgers_shock.mat (x: 256, t: 100, usol: 256 x 100)"})
    quadrature_nodes: int = field(default=100, metadata={"help": "Gauss-Hermite nodes"})


def _family(name: str):
    from nerf_pinn.nerf import NerfFamily
    from nerf_pinn.pinn import PinnFamily
    from nerf_pinn.siren import SirenFamily

    return {"pinn": PinnFamily, "siren": SirenFamily, "nerf": NerfFamily}[name]


FAMILIES = {"pinn": PinnConfig, "siren": SirenConfig, "nerf": NerfConfig}


def _run_family(args: argparse.Namespace) -> None:
    from nerf_pinn.experiment import compare

    toml = ac.read_toml(args.config) if args.config is not None else {}
    config = ac.config_from(FAMILIES[args.command], args, toml=toml)
    compare(_family(args.command)(config))
    print((Path(config.out) / "results.md").read_text())
    print(f"records: {Path(config.out) / 'results.jsonl'}; plots: {Path(config.out)}/*.png")


def _scene(args: argparse.Namespace) -> None:
    from nerf_pinn.scenes import render_synthetic_scene

    config = ac.config_from(SceneConfig, args)
    path = render_synthetic_scene(config.out, num_views=config.num_views, size=config.size, seed=config.seed)
    print(f"wrote {path}")


def _check(args: argparse.Namespace) -> None:
    from nerf_pinn.burgers import compare_with_mat

    config = ac.config_from(CheckConfig, args)
    print(json.dumps(compare_with_mat(config.mat, quadrature_nodes=config.quadrature_nodes)))


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``nerf-pinn`` and its subcommands (``--help`` on each)."""
    parser = argparse.ArgumentParser(
        prog="nerf-pinn",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    helps = {"pinn": "PINN for viscous Burgers", "siren": "SIREN image fit", "nerf": "NeRF on posed images"}
    for name, cls in FAMILIES.items():
        sub = commands.add_parser(name, help=helps[name], description=cls.__doc__)
        sub.add_argument(
            "--config", type=Path, default=None, help="TOML file whose keys are the flags' names"
        )
        ac.add_dataclass_arguments(sub, cls)
        sub.set_defaults(run=_run_family)
    scene = commands.add_parser("scene", help="render the synthetic scene", description=SceneConfig.__doc__)
    ac.add_dataclass_arguments(scene, SceneConfig)
    scene.set_defaults(run=_scene)
    check = commands.add_parser("burgers-check", help="check the reference", description=CheckConfig.__doc__)
    ac.add_dataclass_arguments(check, CheckConfig)
    check.set_defaults(run=_check)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``nerf-pinn`` with ``argv`` (default: the command line); errors exit with status 2."""
    return ac.run_cli(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
