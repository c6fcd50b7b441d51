"""lra-bench: train and compare any attention on the Long Range Arena, with the paper's tables.

Subcommands:

- train --task T --attention A --attention-features F --seed S --data DIR: one run (torchrun for DDP);
- sweep: task x attention x attention features x seed, skipping finished runs, --shard i/n;
- report RESULTS: Tables 1, 7, 8 (Markdown, CSV) and the Figure 4 heatmaps (PNG);
- quick (alias quickstart): generate a small ListOps set, train a few attentions on the CPU, print Table 1;
- list: the attention names.

Every setting is a flag and a key of the TOML file given with --config; flags win.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import app_common as ac
import rf_attention
from lra_bench.config import GRID, QuickConfig, ReportConfig, SweepConfig, TrainConfig, train_config

_TOML_HELP = "[table6.<task>] tables override Table 6"


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``lra-bench`` and its subcommands (``--help`` on each)."""
    parser, commands = ac.app_parser("lra-bench", __doc__)

    train = commands.add_parser(
        "train", help="one training run", description=ac.plain_text(TrainConfig.__doc__)
    )
    ac.add_config_argument(train, _TOML_HELP)
    ac.add_dataclass_arguments(train, TrainConfig)
    train.set_defaults(run=_train)

    sweep = commands.add_parser(
        "sweep",
        help="a grid of runs, resumable and shardable",
        description=ac.plain_text(SweepConfig.__doc__),
    )
    ac.add_config_argument(sweep, _TOML_HELP)
    ac.add_dataclass_arguments(sweep.add_argument_group("grid"), SweepConfig)
    ac.add_dataclass_arguments(sweep.add_argument_group("settings of every run"), TrainConfig, exclude=GRID)
    sweep.set_defaults(run=_sweep)

    report = commands.add_parser(
        "report", help="paper-style tables and heatmaps", description=ac.plain_text(ReportConfig.__doc__)
    )
    ac.add_dataclass_arguments(report, ReportConfig, positional=("results",))
    report.set_defaults(run=_report)

    quick = commands.add_parser(
        "quick",
        aliases=["quickstart"],
        help="small offline run of the whole pipeline (alias: quickstart)",
        description=ac.plain_text(QuickConfig.__doc__),
    )
    ac.add_dataclass_arguments(quick, QuickConfig)
    quick.set_defaults(run=_quick)

    names = commands.add_parser(
        "list", help="list the attention names", description="Print rf_attention.names()."
    )
    names.add_argument("pattern", nargs="?", default=None, help="shell-style filter, e.g. 'oprf-*'")
    names.set_defaults(run=_list)
    return parser


def _train(args: argparse.Namespace) -> None:
    from lra_bench.train import train

    table = ac.read_config(args)
    (settings,) = ac.split_toml(table, TrainConfig, extra=("table6",), source=args.config)
    settings.update({k: v for k, v in vars(args).items() if k in ac.leaf_fields(TrainConfig)})
    train(train_config(settings, table.get("table6")))


def _sweep(args: argparse.Namespace) -> None:
    from lra_bench.sweep import run_sweep

    table = ac.read_config(args)
    grid_toml, run_toml = ac.split_toml(
        table, SweepConfig, TrainConfig, extra=("table6",), source=args.config
    )
    sweep = ac.config_from(SweepConfig, args, toml=grid_toml)
    run_fields = set(ac.leaf_fields(TrainConfig)) - set(GRID)
    settings = {k: v for k, v in run_toml.items() if k in run_fields}
    settings.update({k: v for k, v in vars(args).items() if k in run_fields})
    outcome = run_sweep(sweep, settings, table.get("table6"))
    if outcome["failed"]:
        raise RuntimeError(f"{len(outcome['failed'])} runs failed: {', '.join(outcome['failed'])}")


def _report(args: argparse.Namespace) -> None:
    from lra_bench.report import report

    config = ac.config_from(ReportConfig, args)
    tables = report(config)
    print(tables["table1"])
    out = ac.report_folder(config.results, config.report_dir)
    print(f"\ntables (Markdown, CSV) and heatmaps written to {out}")


def _quick(args: argparse.Namespace) -> None:
    from lra_bench.quickstart import quick

    config = ac.config_from(QuickConfig, args)
    print(quick(config))
    print(f"\nfull report: {Path(config.out) / 'report'}")


def _list(args: argparse.Namespace) -> None:
    print("\n".join(rf_attention.names(args.pattern)))


def main(argv: list[str] | None = None) -> int:
    """Run ``lra-bench`` with ``argv`` (default: the command line); errors exit with status 2."""
    return ac.run_cli(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
