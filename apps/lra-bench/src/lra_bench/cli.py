"""lra-bench: train and compare any attention on the Long Range Arena, with the paper's tables.

Subcommands:

- train --task T --attention A --attention-features F --seed S --data DIR: one run (torchrun for DDP);
- sweep: task x attention x attention features x seed, skipping finished runs, --shard i/n;
- evaluate: the best weights so far of an unfinished run on the test split, and its validation curve;
- report RESULTS: Tables 1, 7, 8 (Markdown, CSV) and the Figure 4 heatmaps (PNG);
- curves PARTIAL: `evaluate`'s validation curves against Table 1's ListOps accuracy (curves.png);
- quick (alias quickstart): generate a small ListOps set, train a few attentions on the CPU, print Table 1;
- list: the attention names.

Every setting is a flag and a key of the TOML file given with --config; flags win.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import rf_attention
from app_common import cli
from app_common.config import config_from, leaf_fields, read_config, split_toml
from app_common.records import report_folder
from app_common.vocabulary import FLAGS
from lra_bench.config import GRID, QuickConfig, ReportConfig, SweepConfig, TrainConfig, train_config

_TOML_HELP = "[table6.<task>] tables override Table 6"
#: The file under ``--out`` that ``lra-bench evaluate`` appends its records to.
PARTIAL = "partial.jsonl"


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``lra-bench`` and its subcommands (``--help`` on each)."""
    parser, commands = cli.app_parser("lra-bench", __doc__)
    cli.add_command(commands, "train", TrainConfig, _train, help="one training run", config_file=_TOML_HELP)
    cli.add_command(
        commands,
        "sweep",
        SweepConfig,
        _sweep,
        help="a grid of runs, resumable and shardable",
        config_file=_TOML_HELP,
        each_run=TrainConfig,
        grid=GRID,
    )
    cli.add_command(
        commands,
        "evaluate",
        TrainConfig,
        _evaluate,
        help="test an unfinished run's best weights so far (same flags as train)",
        config_file=_TOML_HELP,
    )
    cli.add_report_command(commands, ReportConfig, _report, help="paper-style tables and heatmaps")
    curves = commands.add_parser("curves", help="validation curves of evaluate's records (PNG)")
    curves.add_argument("partial", type=Path, help="JSON-lines file of lra-bench evaluate")
    curves.add_argument(
        "--report-dir", type=Path, default=None, help=FLAGS["report_dir"] + "; writes curves.png"
    )
    curves.set_defaults(run=_curves)
    cli.add_command(
        commands,
        "quick",
        QuickConfig,
        _quick,
        help="small offline run of the whole pipeline (alias: quickstart)",
        aliases=("quickstart",),
        config_file=False,
    )
    cli.add_list_command(commands, {"attentions": rf_attention.names}, help="list the attention names")
    return parser


def _train_config(args: argparse.Namespace) -> TrainConfig:
    """``train``'s (and ``evaluate``'s) configuration: flags over the TOML file, Table 6 filled in."""
    table = read_config(args)
    (settings,) = split_toml(table, TrainConfig, extra=("table6",), source=args.config)
    settings.update({k: v for k, v in vars(args).items() if k in leaf_fields(TrainConfig)})
    return train_config(settings, table.get("table6"))


def _train(args: argparse.Namespace) -> None:
    from lra_bench.train import train

    train(_train_config(args))


def _sweep(args: argparse.Namespace) -> None:
    from lra_bench.sweep import run_sweep

    table = read_config(args)
    grid_toml, run_toml = split_toml(table, SweepConfig, TrainConfig, extra=("table6",), source=args.config)
    sweep = config_from(SweepConfig, args, toml=grid_toml)
    run_fields = set(leaf_fields(TrainConfig)) - set(GRID)
    settings = {k: v for k, v in run_toml.items() if k in run_fields}
    settings.update({k: v for k, v in vars(args).items() if k in run_fields})
    outcome = run_sweep(sweep, settings, table.get("table6"))
    if outcome["failed"]:
        raise RuntimeError(f"{len(outcome['failed'])} runs failed: {', '.join(outcome['failed'])}")


def _evaluate(args: argparse.Namespace) -> None:
    import json

    from app_common.results import append_jsonl
    from lra_bench.train import evaluate_so_far

    config = _train_config(args)
    record = evaluate_so_far(config)
    append_jsonl(Path(config.out) / PARTIAL, record)
    print(json.dumps({k: v for k, v in record.items() if k != "curve"}))
    print(f"appended to {Path(config.out) / PARTIAL}")


def _curves(args: argparse.Namespace) -> None:
    from app_common.results import read_jsonl
    from lra_bench.report import learning_curves

    out = report_folder(args.partial, args.report_dir) / "curves.png"
    print(learning_curves(list(read_jsonl(args.partial)), out))


def _report(args: argparse.Namespace) -> None:
    from lra_bench.report import report

    config = cli.command_config(args)
    tables = report(config)
    print(tables["table1"])
    out = report_folder(config.results, config.report_dir)
    print(f"\ntables (Markdown, CSV) and heatmaps written to {out}")


def _quick(args: argparse.Namespace) -> None:
    from lra_bench.quickstart import quick

    config = cli.command_config(args)
    print(quick(config))
    print(f"\nfull report: {Path(config.out) / 'report'}")


def main(argv: list[str] | None = None) -> int:
    """Run ``lra-bench`` with ``argv`` (default: the command line); errors exit with status 2."""
    return cli.run_cli(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
