"""nerf-pinn: coordinate networks with linearized MLPs (RaLiMP, SNNK, EUGen) against the dense MLP.

Subcommands:

- train --family pinn|siren|nerf: train and compare the variants of one family (the family's flags:
  nerf-pinn <family> --help);
- pinn, siren, nerf: shortcuts of train --family <family>: a PINN for viscous Burgers (relative L2 error
  against the Cole-Hopf reference), SIREN fitting an image (PSNR), NeRF on posed images (PSNR);
- quick: the offline demo (the PINN family, small, on the CPU);
- report RESULTS...: the Markdown and CSV table of a family's records (results files, run folders, logs
  of unfinished runs) and the figure of the RaLiMP paper's statements against them (paper.png);
- list: the families and the layer kinds;
- scene: render the offline synthetic scene to an npz file (the tiny_nerf format);
- burgers-check: compare the reference solution with a burgers_shock.mat file.

Every family trains each variant, then times the inference of all of them in the same run; results go to
<out>/results.jsonl, <out>/results.md and PNG plots. Every setting is a flag and a key of the TOML file
given with --config (the paper-scale settings ship in the app's configs/); flags win.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from app_common import cli
from app_common.config import (
    config_from,
    flag,
    leaf_fields,
    read_config,
)
from app_common.fields import OutputFields, RuntimeFields, group_settings, option
from app_common.records import report_folder
from nerf_pinn.config import FAMILIES
from nerf_pinn.families import family_class
from nerf_pinn.layers import KINDS


@dataclass(frozen=True)
class TrainConfig:
    """Train and compare the variants of one family; its flags: nerf-pinn <family> --help."""

    family: str = field(metadata={"help": "the experiment family", "choices": tuple(FAMILIES)})


@dataclass(frozen=True)
class SceneConfig:
    """``nerf-pinn scene``: render the offline synthetic scene (analytic shapes) to an npz file."""

    scene: Path = field(
        default=Path("results/nerf-pinn/synthetic_scene.npz"), metadata={"help": "the npz file written"}
    )
    num_views: int = field(default=40, metadata={"help": "views"})
    size: int = field(default=32, metadata={"help": "image height and width"})
    seed: int = option("seed", 0, help="here: of the azimuth jitter")


@dataclass(frozen=True, kw_only=True)
class QuickConfig(RuntimeFields, OutputFields):
    """``nerf-pinn quick``: the offline demo: the PINN family, dense against RaLiMP and EUGen, on the CPU."""

    out: Path = option("out", Path("results/nerf-pinn-quick"))
    steps: int = option("steps", 500, help="Adam steps (then 5 L-BFGS steps)")
    seed: int = option("seed", 0)
    threads: int = option("threads", 1, help="the networks are small: more threads only contend")


@dataclass(frozen=True)
class ReportConfig:
    """``nerf-pinn report RESULTS...``: the table of one family's records and the paper-vs-ours figure.

    The figure (`nerf_pinn.paper.plot_paper_figure`) draws each variant's metric, the mean over its seeds
    with min-max bars, and its parameters over the dense model's, next to what the RaLiMP paper states.
    """

    results: tuple[Path, ...] = field(
        metadata={
            "help": "results.jsonl files, record.json files, --out folders (every seed's runs/*/record.json "
            "and the log.jsonl of unfinished runs) or <kind>.log.jsonl logs, of one family",
            "metavar": "RESULTS",
        }
    )
    report_dir: Path | None = option("report_dir", None)
    figure: Path | None = field(
        default=None, metadata={"help": "the paper-vs-ours PNG (default: paper.png in the report folder)"}
    )


@dataclass(frozen=True)
class CheckConfig:
    """``nerf-pinn burgers-check``: relative L2 difference of the reference and a burgers_shock.mat file."""

    mat: Path = field(metadata={"help": "path of burgers_shock.mat (x: 256, t: 100, usol: 256 x 100)"})
    quadrature_nodes: int = field(default=100, metadata={"help": "Gauss-Hermite nodes"})


def _run_family(args: argparse.Namespace) -> None:
    from nerf_pinn.experiment import compare

    table = read_config(args)
    # set by the family's own subcommand, or train's --family (a flag or a key of the --config file)
    family = getattr(args, "family", None) or table.pop("family", None)
    if family not in FAMILIES:
        raise ValueError(f"--family: expected one of {', '.join(FAMILIES)}, got {family!r}")
    fields = leaf_fields(FAMILIES[family])
    foreign = sorted(k for k in vars(args) if k in _ALL_FIELDS and k not in fields)
    if foreign:
        flags = ", ".join(flag(k) for k in foreign)
        raise ValueError(f"{flags}: not a setting of the {family} family (see nerf-pinn {family} --help)")
    config = config_from(FAMILIES[family], args, toml=table)
    compare(family_class(family)(config))
    print((Path(config.out) / "results.md").read_text())
    print(f"records: {Path(config.out) / 'results.jsonl'}; plots: {Path(config.out)}/*.png")


_ALL_FIELDS = {name for cls in FAMILIES.values() for name in leaf_fields(cls)}


def _quick(args: argparse.Namespace) -> None:
    from nerf_pinn.config import PinnConfig
    from nerf_pinn.experiment import compare
    from nerf_pinn.pinn import PinnFamily

    quick = cli.command_config(args)
    config = PinnConfig(
        layer=("dense", "ralimp", "eugen"),
        steps=quick.steps,
        lbfgs_steps=5,
        seed=quick.seed,
        out=quick.out,
        resume=quick.resume,
        **group_settings(quick, RuntimeFields),
    )
    compare(PinnFamily(config))
    print((Path(config.out) / "results.md").read_text())


def _report(args: argparse.Namespace) -> None:
    from nerf_pinn.experiment import results_table, write_csv
    from nerf_pinn.paper import family_of, load_runs, plot_paper_figure, results_inputs

    config = cli.command_config(args)
    records, unfinished = load_runs(config.results)
    if not records:
        raise ValueError(f"RESULTS: no finished record in {', '.join(map(str, config.results))} yet")
    metric = family_class(family_of(records)).metric
    out = report_folder(results_inputs(config.results), config.report_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = results_table(records, metric)
    (out / "results.md").write_text(table + "\n")
    write_csv(records, metric, out / "results.csv")
    figure = plot_paper_figure(records, unfinished, config.figure or out / "paper.png")
    print(table)
    print(f"figure: {figure}")


def _scene(args: argparse.Namespace) -> None:
    from nerf_pinn.scenes import render_synthetic_scene

    config = cli.command_config(args)
    path = render_synthetic_scene(
        config.scene, num_views=config.num_views, size=config.size, seed=config.seed
    )
    print(f"wrote {path}")


def _check(args: argparse.Namespace) -> None:
    from nerf_pinn.burgers import compare_with_mat

    config = cli.command_config(args)
    print(json.dumps(compare_with_mat(config.mat, quadrature_nodes=config.quadrature_nodes)))


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``nerf-pinn`` and its subcommands (``--help`` on each)."""
    parser, commands = cli.app_parser("nerf-pinn", __doc__)
    # every family's flags, once each; _run_family refuses those of another family
    cli.add_command(
        commands,
        "train",
        TrainConfig,
        _run_family,
        help="train and compare the variants of one family",
        also=tuple(FAMILIES.values()),
    )
    helps = {"pinn": "PINN for viscous Burgers", "siren": "SIREN image fit", "nerf": "NeRF on posed images"}
    for name, cls in FAMILIES.items():
        sub = cli.add_command(commands, name, cls, _run_family, help=f"{helps[name]} (train --family {name})")
        sub.set_defaults(family=name)
    cli.add_command(commands, "quick", QuickConfig, _quick, help="offline demo: the PINN family, small")
    cli.add_report_command(commands, ReportConfig, _report, help="the table and the paper-vs-ours figure")
    cli.add_list_command(
        commands,
        {"families": lambda: FAMILIES, "layers": lambda: KINDS},
        help="list the families and layer kinds",
    )
    cli.add_command(
        commands, "scene", SceneConfig, _scene, help="render the synthetic scene", config_file=False
    )
    cli.add_command(
        commands, "burgers-check", CheckConfig, _check, help="check the reference", config_file=False
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``nerf-pinn`` with ``argv`` (default: the command line); errors exit with status 2."""
    return cli.run_cli(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
