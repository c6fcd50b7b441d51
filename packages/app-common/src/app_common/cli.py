"""The apps' command-line entry: run the chosen subcommand, turning expected errors into exit status 2."""

from __future__ import annotations

import argparse

#: Errors a subcommand raises for bad input (a wrong flag value, a missing file): reported, not traced.
USER_ERRORS = (ValueError, FileNotFoundError, RuntimeError)


def run_cli(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line) and call the subcommand's ``run(args)``.

    Subcommands set ``run`` with ``set_defaults(run=...)`` and are stored as ``args.command``. A
    [`USER_ERRORS`][app_common.USER_ERRORS] exception exits with status 2 and
    ``"<prog> <command>: error: <message>"``.

    Returns:
        0 on success.
    """
    args = parser.parse_args(argv)
    try:
        args.run(args)
    except USER_ERRORS as error:
        parser.exit(2, f"{parser.prog} {args.command}: error: {error}\n")
    return 0
