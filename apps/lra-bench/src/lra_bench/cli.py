"""``lra-bench``: train and compare any attention on the Long Range Arena, with the paper's tables.

Subcommands:

- ``train --task T --attention A --features F --seed S --data DIR``: one run (``torchrun`` for DDP);
- ``sweep``: tasks x attentions x features x seeds, skipping finished runs, ``--shard i/n``;
- ``report RESULTS``: Tables 1, 7, 8 (Markdown, CSV) and the Figure 4 heatmaps (PNG);
- ``quickstart``: generate a small ListOps set, train a few attentions on the CPU, print Table 1;
- ``attentions``: list the attention names.

Every setting is a flag and a key of the TOML file given with ``--config``; flags win.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import app_common as ac
import rf_attention
from lra_bench.config import QuickstartConfig, ReportConfig, SweepConfig, TrainConfig

_GRID = ("task", "attention", "features", "seed", "resume")


def _config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="TOML file: keys are the flags' names with underscores; [table6.<task>] tables override Table 6",
    )


def _toml(args: argparse.Namespace) -> dict:
    return ac.read_toml(args.config) if args.config is not None else {}


def _split_toml(table: dict, cls: type) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in table.items() if k in names}


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``lra-bench`` and its subcommands (``--help`` on each)."""
    parser = argparse.ArgumentParser(
        prog="lra-bench",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="one training run", description=TrainConfig.__doc__)
    _config_flag(train)
    ac.add_dataclass_arguments(train, TrainConfig)
    train.set_defaults(run=_train)

    sweep = commands.add_parser(
        "sweep", help="a grid of runs, resumable and shardable", description=SweepConfig.__doc__
    )
    _config_flag(sweep)
    ac.add_dataclass_arguments(sweep.add_argument_group("grid"), SweepConfig)
    ac.add_dataclass_arguments(sweep.add_argument_group("settings of every run"), TrainConfig, exclude=_GRID)
    sweep.set_defaults(run=_sweep)

    report = commands.add_parser(
        "report", help="paper-style tables and heatmaps", description=ReportConfig.__doc__
    )
    ac.add_dataclass_arguments(report, ReportConfig, positional=("results",))
    report.set_defaults(run=_report)

    quick = commands.add_parser(
        "quickstart", help="small offline run of the whole pipeline", description=QuickstartConfig.__doc__
    )
    ac.add_dataclass_arguments(quick, QuickstartConfig)
    quick.set_defaults(run=_quickstart)

    names = commands.add_parser(
        "attentions", help="list the attention names", description="Print rf_attention.names()."
    )
    names.add_argument("pattern", nargs="?", default=None, help="shell-style filter, e.g. 'oprf-*'")
    names.set_defaults(run=_attentions)
    return parser


def _train(args: argparse.Namespace) -> None:
    from lra_bench.train import train

    table = _toml(args)
    config = ac.config_from(TrainConfig, args, toml=table)
    train(config.resolved(table.get("table6")))


def _sweep(args: argparse.Namespace) -> None:
    from lra_bench.sweep import run_sweep

    table = _toml(args)
    sweep = ac.config_from(SweepConfig, args, toml=_split_toml(table, SweepConfig))
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)} - set(_GRID)
    unknown = set(table) - train_fields - {f.name for f in dataclasses.fields(SweepConfig)} - {"table6"}
    if unknown:
        raise ValueError(f"{args.config}: unknown keys {', '.join(sorted(unknown))}")
    settings = {k: v for k, v in table.items() if k in train_fields}
    settings.update({k: v for k, v in vars(args).items() if k in train_fields})
    checked = ac.config_from(TrainConfig, settings, task=sweep.tasks[0])  # types and values, once
    shared = {name: getattr(checked, name) for name in train_fields}
    outcome = run_sweep(sweep, shared, table.get("table6"))
    if outcome["failed"]:
        raise RuntimeError(f"{len(outcome['failed'])} runs failed: {', '.join(outcome['failed'])}")


def _report(args: argparse.Namespace) -> None:
    from lra_bench.report import report

    config = ac.config_from(ReportConfig, args)
    tables = report(config)
    print(tables["table1"])
    out = config.out if config.out is not None else Path(config.results).parent / "report"
    print(f"\ntables (Markdown, CSV) and heatmaps written to {out}")


def _quickstart(args: argparse.Namespace) -> None:
    from lra_bench.quickstart import quickstart

    config = ac.config_from(QuickstartConfig, args)
    print(quickstart(config))
    print(f"\nfull report: {Path(config.out) / 'report'}")


def _attentions(args: argparse.Namespace) -> None:
    print("\n".join(rf_attention.names(args.pattern)))


def main(argv: list[str] | None = None) -> int:
    """Run ``lra-bench`` with ``argv`` (default: the command line); errors exit with status 2."""
    return ac.run_cli(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
