"""layer-fit: the synthetic single-layer fit of the RaLiMP paper (Fig. 2).

Subcommands:

- quick: a reduced protocol (about two minutes on two CPU cores), then its report;
- train: the paper's protocol, or any part of it (--activation, --layer, --features, --seed each take
  several values; --steps, --device, --paper-literal, ...); finished runs in the results file are skipped;
- report RESULTS: Markdown/CSV tables (mean +/- std over seeds) with the floors beside them, PNG plots;
- list: the method names.

Every setting is a flag and a key of the TOML file given with --config; flags win.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app_common import cli
from app_common.records import report_folder
from layer_fit.config import FitConfig, QuickConfig, ReportConfig
from layer_fit.methods import METHODS


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``layer-fit`` and its subcommands (``--help`` on each)."""
    parser, commands = cli.app_parser("layer-fit", __doc__)
    for name, cls, text in (
        ("quick", QuickConfig, "reduced protocol on the CPU, then the report"),
        ("train", FitConfig, "the protocol (or a selection), resumable"),
    ):
        cli.add_command(commands, name, cls, _fit_and_report, help=text)
    cli.add_report_command(commands, ReportConfig, _report, help="tables and plots of a results file")
    cli.add_list_command(commands, {"methods": METHODS.names}, help="list the method names")
    return parser


def _print(texts: dict[str, str]) -> None:
    for key in ("table", "floors", "sweep", "sweep_floors"):
        if key in texts:
            print(texts[key] + "\n")


def _fit_and_report(args: argparse.Namespace) -> None:
    from layer_fit.report import report
    from layer_fit.train import run_fit

    config = cli.command_config(args)
    results = run_fit(config)
    features = 32 if 32 in config.features else config.features[0]
    _print(report(ReportConfig(results=results, table_features=features)))
    for departure in config.departures():
        print(f"departure from the paper: {departure}")
    print(f"\nresults: {results}\nreport (Markdown, CSV, PNG): {Path(results).parent / 'report'}")


def _report(args: argparse.Namespace) -> None:
    from layer_fit.report import report

    config = cli.command_config(args)
    _print(report(config))
    out = report_folder(config.results, config.report_dir)
    print(f"tables (Markdown, CSV) and plots (PNG) written to {out}")


def main(argv: list[str] | None = None) -> int:
    """Run ``layer-fit`` with ``argv`` (default: the command line); errors exit with status 2."""
    return cli.run_cli(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
