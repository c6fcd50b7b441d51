"""``vit-finetune``: ViT fine-tuning with the MLPs of the last k blocks replaced by RaLiMP, SNNK or EUGen.

Subcommands:

- ``quick``: the offline demo (small random-init ViT on scikit-learn's digits, CPU, a few minutes);
- ``train``: one run (``--data cifar100 --data-path DIR --layer ralimp --last-k 4 --weights FILE``);
- ``sweep``: the dense run and each layer kind at each k (``--layer a b``, ``--last-k 4 7``);
- ``report RESULTS``: Markdown/CSV table and PNG plots;
- ``list models|layers|attentions``: the names.

Every setting is a flag and a key of the TOML file given with ``--config``; flags win.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import app_common as ac
import rf_attention
from vit_finetune.config import QuickConfig, ReportConfig, SweepConfig, TrainConfig
from vit_finetune.surgery import layer_names
from vit_finetune.weights import MODELS

#: ``vit-finetune list WHAT``: the names it prints.
LISTS = {
    "models": lambda: [f"{name}: {MODELS.get(name).description}" for name in MODELS.names()],
    "layers": layer_names,
    "attentions": rf_attention.names,
}


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``vit-finetune`` and its subcommands (``--help`` on each)."""
    parser, commands = ac.app_parser("vit-finetune", __doc__)

    quick = commands.add_parser(
        "quick", help="offline demo on digits (CPU, minutes)", description=ac.plain_text(QuickConfig.__doc__)
    )
    ac.add_config_argument(quick)
    ac.add_dataclass_arguments(quick, QuickConfig)
    quick.set_defaults(run=_quick)

    train = commands.add_parser(
        "train", help="one fine-tuning run", description=ac.plain_text(TrainConfig.__doc__)
    )
    ac.add_config_argument(train)
    ac.add_dataclass_arguments(train, TrainConfig)
    train.set_defaults(run=_train)

    sweep = commands.add_parser(
        "sweep", help="dense and each layer kind at each k", description=ac.plain_text(SweepConfig.__doc__)
    )
    ac.add_config_argument(sweep)
    ac.add_dataclass_arguments(sweep.add_argument_group("grid"), SweepConfig)
    ac.add_dataclass_arguments(
        sweep.add_argument_group("settings of every run"), TrainConfig, exclude=("layer", "last_k")
    )
    sweep.set_defaults(run=_sweep)

    rep = commands.add_parser(
        "report", help="table and plots of a results file", description=ac.plain_text(ReportConfig.__doc__)
    )
    ac.add_dataclass_arguments(rep, ReportConfig, positional=("results",))
    rep.set_defaults(run=_report)

    ac.add_list_command(commands, LISTS, help="list model names, layer kinds or attention names")
    return parser


def _quick(args: argparse.Namespace) -> None:
    from vit_finetune.sweep import quick

    config = ac.config_from(QuickConfig, args, toml=ac.read_config(args))
    print(quick(config))
    print(f"\nreport (table, curves): {Path(config.out) / 'report'}")


def _train(args: argparse.Namespace) -> None:
    from vit_finetune.train import train

    train(ac.config_from(TrainConfig, args, toml=ac.read_config(args)))


#: The sweep's grid flags: several values each, not the single value of ``train``.
GRID = ("layer", "last_k")


def _sweep(args: argparse.Namespace) -> None:
    from vit_finetune.sweep import run_sweep

    grid, settings = ac.split_toml(ac.read_config(args), SweepConfig, TrainConfig, source=args.config)
    per_run = {k: v for k, v in vars(args).items() if k not in GRID}
    per_run_toml = {k: v for k, v in settings.items() if k not in GRID}
    base = ac.config_from(TrainConfig, per_run, toml=per_run_toml)
    run_sweep(ac.config_from(SweepConfig, args, toml=grid), base)


def _report(args: argparse.Namespace) -> None:
    from vit_finetune.report import report

    config = ac.config_from(ReportConfig, args)
    print(report(config))


def main(argv: list[str] | None = None) -> int:
    """Run ``vit-finetune`` with ``argv`` (default: the command line); errors exit with status 2."""
    return ac.run_cli(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
