"""The apps' command-line entry: run the chosen subcommand, turning expected errors into exit status 2."""

from __future__ import annotations

import argparse
import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from app_common.config import (
    add_config_argument,
    add_dataclass_arguments,
    config_from,
    leaf_fields,
    read_config,
)

#: Errors a subcommand raises for bad input (a wrong flag value, a missing file): reported, not traced.
USER_ERRORS = (ValueError, FileNotFoundError, RuntimeError)


_ROLE = re.compile(r":[a-z]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")
_REFERENCE = re.compile(r"\[`([^`]+)`\]\[[^\]]*\]")
_LITERAL = re.compile(r"``([^`]*)``")
_CODE = re.compile(r"`([^`]+)`")


def plain_text(text: str | None) -> str:
    """A docstring as plain text for ``--help``.

    Cross-references (mkdocstrings' ``[`name`][path]`` and reST roles) become their name, back-quoted
    code loses its quotes, and a closing ``::`` becomes ``:``.
    """
    if not text:
        return ""

    def role(match: re.Match[str]) -> str:
        name = match.group(1).strip()
        return name.rsplit(".", 1)[-1] if match.group(0)[match.group(0).index("`") + 1] == "~" else name

    text = _REFERENCE.sub(r"\1", _ROLE.sub(role, text))
    return _CODE.sub(r"\1", _LITERAL.sub(r"\1", text)).replace("::\n", ":\n")


def app_parser(
    prog: str, doc: str
) -> tuple[argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]]:
    """An app's parser and its subcommands: ``doc``'s first paragraph is the description, the rest the epilog.

    Args:
        prog: the console script (``lra-bench``).
        doc: the CLI module's docstring, plain text (its subcommand list shows in ``--help``).

    Returns:
        ``(parser, commands)``; add subcommands with [`add_command`][app_common.cli.add_command].
    """
    summary, _, rest = plain_text(doc).partition("\n\n")
    parser = argparse.ArgumentParser(
        prog=prog,
        description=summary,
        epilog=rest or None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    return parser, commands


def add_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    config: type,
    run: Callable[[argparse.Namespace], None],
    *,
    help: str,
    aliases: tuple[str, ...] = (),
    config_file: bool | str = True,
    exclude: tuple[str, ...] = (),
    positional: tuple[str, ...] = (),
    each_run: type | None = None,
    grid: tuple[str, ...] = (),
    also: tuple[type, ...] = (),
) -> argparse.ArgumentParser:
    """Register the subcommand ``name``: one flag per field of the dataclass ``config``, then ``run(args)``.

    The description is ``config``'s docstring (plain text); ``args.config_class`` is ``config``, so
    [`command_config`][app_common.cli.command_config] builds the configuration from the flags and the TOML
    file.

    Args:
        commands: the app's subcommands (`app_parser`).
        name: the subcommand (``train``).
        config: its configuration dataclass.
        run: called with the parsed namespace.
        help: the line in the app's subcommand list.
        aliases: other names of the subcommand.
        config_file: give the ``--config FILE`` flag (a string: the app's addition to its help).
        exclude: fields of ``config`` that get no flag.
        positional: fields of ``config`` given as positional arguments.
        each_run: a sweep's per-run configuration: ``config``'s flags go under "grid" and those of
            ``each_run`` (bar the ``grid`` fields, which the grid gives several values) under "settings of
            every run".
        grid: the fields of ``each_run`` that ``config`` sweeps.
        also: further dataclasses whose fields the subcommand takes as flags too, each field once (a
            subcommand whose own field chooses which of them ``run`` builds, as ``train --family``).

    Returns:
        The subcommand's parser (for arguments that are no field).
    """
    parser = commands.add_parser(
        name, aliases=list(aliases), help=help, description=plain_text(config.__doc__)
    )
    if config_file:
        add_config_argument(parser, config_file if isinstance(config_file, str) else None)
    own = parser if each_run is None else parser.add_argument_group("grid")
    add_dataclass_arguments(own, config, exclude=exclude, positional=positional)
    if each_run is not None:
        add_dataclass_arguments(parser.add_argument_group("settings of every run"), each_run, exclude=grid)
    added = set(leaf_fields(config))
    for cls in also:
        add_dataclass_arguments(parser, cls, exclude=tuple(added))
        added.update(leaf_fields(cls))
    parser.set_defaults(run=run, config_class=config)
    return parser


def command_config(args: argparse.Namespace) -> Any:
    """The configuration of an `add_command` subcommand: flags over the TOML file."""
    return config_from(args.config_class, args, toml=read_config(args))


def add_report_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    config: type,
    run: Callable[[argparse.Namespace], None],
    *,
    help: str,
) -> argparse.ArgumentParser:
    """Register ``report RESULTS``: `add_command` with the results file positional and no ``--config``.

    ``config`` is the report's dataclass, with a ``results`` field (the results file a run or grid wrote).
    """
    return add_command(commands, "report", config, run, help=help, config_file=False, positional=("results",))


def add_list_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    lists: Mapping[str, Callable[[], Iterable[str]]],
    *,
    help: str,
) -> argparse.ArgumentParser:
    """The ``list`` subcommand: the names of one kind (``list [PATTERN]``) or of several (``list [WHAT]``).

    With one kind, ``list`` prints its names one a line, ``list PATTERN`` those matching the shell-style
    pattern (``'oprf-*'``, any case). With several, ``list WHAT`` prints the names of one kind, one a
    line, and ``list`` alone every kind under a ``<kind>:`` heading, so ``<app> list`` runs in every app.

    Args:
        commands: the app's subcommands (`app_parser`).
        lists: kind -> a function returning its names (``{"layers": ralimp.names, ...}``).
        help: the subcommand's help line.
    """
    if len(lists) == 1:
        (names_of,) = lists.values()

        def show(args: argparse.Namespace) -> None:
            pattern = None if args.pattern is None else args.pattern.lower()
            names = [n for n in names_of() if pattern is None or fnmatch.fnmatchcase(n.lower(), pattern)]
            print("\n".join(names))

        names = commands.add_parser(
            "list", help=help, description="Print the names (those matching PATTERN)."
        )
        names.add_argument("pattern", nargs="?", default=None, help="shell-style filter, e.g. 'oprf-*'")
        names.set_defaults(run=show)
        return names

    def show_kinds(args: argparse.Namespace) -> None:
        kinds = [args.what] if args.what is not None else list(lists)
        for kind in kinds:
            names = list(lists[kind]())
            print("\n".join(names) if args.what is not None else f"{kind}:\n  " + "\n  ".join(names))

    names = commands.add_parser("list", help=help, description="Print the names (every kind without WHAT).")
    names.add_argument("what", nargs="?", choices=tuple(lists), help="which names (default: every kind)")
    names.set_defaults(run=show_kinds)
    return names


def run_cli(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line) and call the subcommand's ``run(args)``.

    Subcommands ([`add_command`][app_common.cli.add_command]) set ``run`` and are stored as ``args.command``.
    A [`USER_ERRORS`][app_common.cli.USER_ERRORS] exception exits with status 2 and
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
