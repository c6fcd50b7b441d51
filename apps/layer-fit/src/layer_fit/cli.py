"""``layer-fit``: the synthetic single-layer fit of the RaLiMP paper (Fig. 2).

Subcommands:

- ``quick``: a reduced protocol (under two minutes on two CPU cores), then its report;
- ``run``: the paper's protocol, or any part of it (``--activations``, ``--methods``, ``--budgets``,
  ``--seeds``, ``--steps``, ``--device``); finished runs in the results file are skipped;
- ``report RESULTS``: Markdown/CSV tables (mean +/- std over seeds) and PNG plots;
- ``methods``: list the method names.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import app_common as ac
from layer_fit.config import FitConfig, QuickConfig, ReportConfig
from layer_fit.methods import METHODS


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``layer-fit`` and its subcommands (``--help`` on each)."""
    parser = argparse.ArgumentParser(
        prog="layer-fit",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)

    quick = commands.add_parser(
        "quick", help="reduced protocol on the CPU, then the report", description=QuickConfig.__doc__
    )
    ac.add_dataclass_arguments(quick, QuickConfig)
    quick.set_defaults(run=_quick)

    run = commands.add_parser(
        "run", help="the protocol (or a selection), resumable", description=FitConfig.__doc__
    )
    ac.add_dataclass_arguments(run, FitConfig)
    run.set_defaults(run=_run)

    report = commands.add_parser(
        "report", help="tables and plots of a results file", description=ReportConfig.__doc__
    )
    ac.add_dataclass_arguments(report, ReportConfig, positional=("results",))
    report.set_defaults(run=_report)

    names = commands.add_parser("methods", help="list the method names", description="Print the methods.")
    names.set_defaults(run=lambda args: print("\n".join(METHODS.names())))
    return parser


def _fit_and_report(config: FitConfig) -> None:
    from layer_fit.report import report
    from layer_fit.train import run_fit

    results = run_fit(config)
    texts = report(ReportConfig(results=results, budget=32 if 32 in config.budgets else config.budgets[0]))
    print(texts["table"])
    if "sweep" in texts:
        print("\n" + texts["sweep"])
    print(f"\nresults: {results}\nreport (Markdown, CSV, PNG): {Path(results).parent / 'report'}")


def _quick(args: argparse.Namespace) -> None:
    _fit_and_report(ac.config_from(QuickConfig, args))


def _run(args: argparse.Namespace) -> None:
    _fit_and_report(ac.config_from(FitConfig, args))


def _report(args: argparse.Namespace) -> None:
    from layer_fit.report import report

    config = ac.config_from(ReportConfig, args)
    texts = report(config)
    print(texts["table"])
    if "sweep" in texts:
        print("\n" + texts["sweep"])
    out = config.out if config.out is not None else Path(config.results).parent / "report"
    print(f"\ntables (Markdown, CSV) and plots (PNG) written to {out}")


def main(argv: list[str] | None = None) -> int:
    """Run ``layer-fit`` with ``argv`` (default: the command line); errors exit with status 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.run(args)
    except (ValueError, FileNotFoundError) as error:
        parser.exit(2, f"layer-fit {args.command}: error: {error}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
