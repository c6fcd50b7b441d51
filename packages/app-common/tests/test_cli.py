import argparse
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from app_common.cli import (
    add_command,
    add_list_command,
    add_report_command,
    app_parser,
    command_config,
    plain_text,
    run_cli,
)


def parser_with(run):
    parser = argparse.ArgumentParser(prog="tool")
    commands = parser.add_subparsers(dest="command", required=True)
    go = commands.add_parser("go")
    go.add_argument("--value", type=int, default=1)
    go.set_defaults(run=run)
    return parser


def test_run_cli_calls_the_subcommand_with_its_arguments():
    seen = []
    assert run_cli(parser_with(lambda args: seen.append(args.value)), ["go", "--value", "7"]) == 0
    assert seen == [7]


def test_user_errors_exit_with_status_2_and_a_one_line_message(capsys):
    def fail(args):
        raise FileNotFoundError("data: /nowhere does not exist")

    with pytest.raises(SystemExit) as exit_info:
        run_cli(parser_with(fail), ["go"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "tool go: error: data: /nowhere does not exist\n"


def test_plain_text_drops_sphinx_roles_and_literal_quotes():
    text = "Runs ``lra-bench`` with :data:`TABLE_6`, :meth:`~lra_bench.TrainConfig.resolved` and::\n"
    assert plain_text(text) == "Runs lra-bench with TABLE_6, resolved and:\n"
    text = (
        "See [`run_name`][lra_bench.run_name] and `app_common` ([`Checkpointer`][app_common.Checkpointer])."
    )
    assert plain_text(text) == "See run_name and app_common (Checkpointer)."
    assert plain_text(None) == ""


def test_app_parser_shows_the_plain_summary_and_the_subcommand_list(capsys):
    parser, commands = app_parser("tool", "tool: does ``things``.\n\nSubcommands:\n\n- go: goes.\n")
    commands.add_parser("go")
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    text = capsys.readouterr().out
    assert "tool: does things." in text
    assert "- go: goes." in text
    with pytest.raises(SystemExit):
        parser.parse_args([])  # a subcommand is required


def test_list_prints_one_kind_or_every_kind_under_its_heading(capsys):

    parser, commands = app_parser("tool", "A tool.")
    add_list_command(
        commands, {"layers": lambda: ["dense", "ralimp"], "attentions": lambda: ["softmax"]}, help="x"
    )
    assert run_cli(parser, ["list", "layers"]) == 0
    assert capsys.readouterr().out == "dense\nralimp\n"
    assert run_cli(parser, ["list"]) == 0
    assert capsys.readouterr().out == "layers:\n  dense\n  ralimp\nattentions:\n  softmax\n"


def test_list_of_one_kind_filters_by_a_shell_pattern(capsys):

    parser, commands = app_parser("tool", "A tool.")
    add_list_command(commands, {"attentions": lambda: ["oprf-orf", "oprf-qmc", "softmax"]}, help="x")
    assert run_cli(parser, ["list", "OPRF-*"]) == 0
    assert capsys.readouterr().out == "oprf-orf\noprf-qmc\n"


def _toy_command(**kw):

    @dataclass(frozen=True)
    class GoConfig:
        """``tool go``: goes ``far``."""

        steps: int = field(default=3, metadata={"help": "steps"})
        lr: float = field(default=0.1, metadata={"help": "rate"})

    seen = []
    parser, commands = app_parser("tool", "A tool.")
    sub = add_command(
        commands, "go", GoConfig, lambda args: seen.append(command_config(args)), help="x", **kw
    )
    return parser, sub, seen


def test_a_command_builds_its_config_from_the_flags_over_the_toml_file(tmp_path):
    parser, _, seen = _toy_command()
    (tmp_path / "go.toml").write_text("steps = 5\nlr = 0.5\n")
    assert run_cli(parser, ["go", "--config", str(tmp_path / "go.toml"), "--lr", "0.25"]) == 0
    assert (seen[0].steps, seen[0].lr) == (5, 0.25)


def test_a_command_is_described_by_its_config_docstring_as_plain_text():
    _, sub, _ = _toy_command()
    assert sub.description == "tool go: goes far."


def test_a_command_without_a_config_file_has_no_config_flag():
    parser, _, _ = _toy_command(config_file=False)
    with pytest.raises(SystemExit):
        parser.parse_args(["go", "--config", "x.toml"])


def test_a_sweep_command_leaves_its_grid_fields_to_the_grid():

    @dataclass(frozen=True)
    class Grid:
        seed: tuple[int, ...] = (0,)

    @dataclass(frozen=True)
    class Run:
        seed: int = 0
        steps: int = 1

    _, commands = app_parser("tool", "A tool.")
    sub = add_command(commands, "sweep", Grid, print, help="x", each_run=Run, grid=("seed",))
    args = sub.parse_args(["--seed", "1", "2", "--steps", "4"])
    assert (args.seed, args.steps) == ([1, 2], 4)


def test_a_report_command_takes_the_results_file_positional_and_no_config_flag(tmp_path):

    @dataclass(frozen=True)
    class ReportConfig:
        """``tool report RESULTS``."""

        results: Path

    seen = []
    parser, commands = app_parser("tool", "A tool.")
    add_report_command(commands, ReportConfig, lambda args: seen.append(command_config(args)), help="x")
    assert run_cli(parser, ["report", str(tmp_path / "r.jsonl")]) == 0
    assert seen == [ReportConfig(results=tmp_path / "r.jsonl")]
    with pytest.raises(SystemExit):
        parser.parse_args(["report", "r.jsonl", "--config", "x.toml"])


def test_a_command_also_takes_the_flags_of_further_configs_each_once():

    @dataclass(frozen=True)
    class Choice:
        """``tool train``."""

        family: str = field(default="a", metadata={"help": "which"})

    @dataclass(frozen=True)
    class A:
        steps: int = 1
        width: int = 2

    @dataclass(frozen=True)
    class B:
        steps: int = 3
        depth: int = 4

    _, commands = app_parser("tool", "A tool.")
    sub = add_command(commands, "train", Choice, lambda args: None, help="x", also=(A, B))
    flags = [option for action in sub._actions for option in action.option_strings]
    assert sorted(f for f in flags if f not in ("-h", "--help", "--config")) == [
        "--depth",
        "--family",
        "--steps",
        "--width",
    ]
