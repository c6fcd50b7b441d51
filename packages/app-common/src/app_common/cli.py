"""The apps' command-line entry: run the chosen subcommand, turning expected errors into exit status 2."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable, Mapping

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
        ``(parser, commands)``; add subcommands with ``commands.add_parser`` and ``set_defaults(run=...)``.
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


def add_list_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    lists: Mapping[str, Callable[[], Iterable[str]]],
    *,
    help: str,
) -> argparse.ArgumentParser:
    """The ``list [WHAT]`` subcommand of an app with several kinds of names.

    ``list WHAT`` prints the names of one kind, one a line; ``list`` alone prints every kind under a
    ``<kind>:`` heading, so ``<app> list`` runs in every app.

    Args:
        commands: the app's subcommands (`app_parser`).
        lists: kind -> a function returning its names (``{"layers": ralimp.names, ...}``).
        help: the subcommand's help line.
    """

    def show(args: argparse.Namespace) -> None:
        kinds = [args.what] if args.what is not None else list(lists)
        for kind in kinds:
            names = list(lists[kind]())
            print("\n".join(names) if args.what is not None else f"{kind}:\n  " + "\n  ".join(names))

    names = commands.add_parser("list", help=help, description="Print the names (every kind without WHAT).")
    names.add_argument("what", nargs="?", choices=tuple(lists), help="which names (default: every kind)")
    names.set_defaults(run=show)
    return names


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
