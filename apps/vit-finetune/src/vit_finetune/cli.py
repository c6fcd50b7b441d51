"""``vit-finetune``: ViT fine-tuning with the MLPs of the last k blocks replaced by RaLiMP, SNNK or EUGen.

Subcommands:

- ``quick``: the offline demo (small random-init ViT on scikit-learn's digits, CPU, a few minutes);
- ``train``: one run (``--data cifar100 --data-path DIR --layer ralimp --last-k 4 --weights FILE``);
- ``sweep``: the dense run and each layer kind at each k (``--layers``, ``--ks``);
- ``report RESULTS``: Markdown/CSV table and PNG plots;
- ``models``, ``layers``, ``attentions``: list the names.

Every setting is a flag and a key of the TOML file given with ``--config``; flags win.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import app_common as ac
import rf_attention
from vit_finetune.config import QuickConfig, ReportConfig, SweepConfig, TrainConfig
from vit_finetune.surgery import layer_names
from vit_finetune.weights import MODELS


def _toml(args: argparse.Namespace) -> dict:
    return ac.read_toml(args.config) if args.config is not None else {}


def _only(table: dict, cls: type) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in table.items() if k in names}


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``vit-finetune`` and its subcommands (``--help`` on each)."""
    parser = argparse.ArgumentParser(
        prog="vit-finetune",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)

    quick = commands.add_parser(
        "quick", help="offline demo on digits (CPU, minutes)", description=QuickConfig.__doc__
    )
    ac.add_dataclass_arguments(quick, QuickConfig)
    quick.set_defaults(run=_quick)

    train = commands.add_parser("train", help="one fine-tuning run", description=TrainConfig.__doc__)
    train.add_argument("--config", type=Path, default=None, help="TOML file whose keys are the flags' names")
    ac.add_dataclass_arguments(train, TrainConfig)
    train.set_defaults(run=_train)

    sweep = commands.add_parser(
        "sweep", help="dense and each layer kind at each k", description=SweepConfig.__doc__
    )
    sweep.add_argument("--config", type=Path, default=None, help="TOML file whose keys are the flags' names")
    ac.add_dataclass_arguments(sweep.add_argument_group("grid"), SweepConfig)
    ac.add_dataclass_arguments(
        sweep.add_argument_group("settings of every run"), TrainConfig, exclude=("layer", "last_k")
    )
    sweep.set_defaults(run=_sweep)

    rep = commands.add_parser(
        "report", help="table and plots of a results file", description=ReportConfig.__doc__
    )
    ac.add_dataclass_arguments(rep, ReportConfig, positional=("results",))
    rep.set_defaults(run=_report)

    for name, lister, text in (
        ("models", lambda: [f"{n}: {MODELS.get(n).description}" for n in MODELS.names()], "model names"),
        ("layers", layer_names, "layer kinds (dense and ralimp's)"),
        ("attentions", rf_attention.names, "rf_attention names for --attention"),
    ):
        sub = commands.add_parser(name, help=f"list the {text}", description=f"Print the {text}.")
        sub.set_defaults(run=lambda args, lister=lister: print("\n".join(lister())))
    return parser


def _quick(args: argparse.Namespace) -> None:
    from vit_finetune.sweep import quick

    config = ac.config_from(QuickConfig, args)
    print(quick(config))
    print(f"\nreport (table, curves): {Path(config.out) / 'report'}")


def _train(args: argparse.Namespace) -> None:
    from vit_finetune.train import train

    train(ac.config_from(TrainConfig, args, toml=_toml(args)))


def _sweep(args: argparse.Namespace) -> None:
    from vit_finetune.sweep import run_sweep

    table = _toml(args)
    unknown = (
        set(table)
        - {f.name for f in dataclasses.fields(TrainConfig)}
        - {f.name for f in dataclasses.fields(SweepConfig)}
    )
    if unknown:
        raise ValueError(f"{args.config}: unknown keys {', '.join(sorted(unknown))}")
    sweep = ac.config_from(SweepConfig, args, toml=_only(table, SweepConfig))
    base = ac.config_from(TrainConfig, args, toml=_only(table, TrainConfig))
    run_sweep(sweep, base)


def _report(args: argparse.Namespace) -> None:
    from vit_finetune.report import report

    config = ac.config_from(ReportConfig, args)
    print(report(config))


def main(argv: list[str] | None = None) -> int:
    """Run ``vit-finetune`` with ``argv`` (default: the command line); errors exit with status 2."""
    return ac.run_cli(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
