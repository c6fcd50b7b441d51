"""Test helpers the apps' test suites share: resume equality, the flag-vocabulary contract.

Every app's suite calls [`assert_resume_equals_unbroken`][app_common.testing.assert_resume_equals_unbroken]
with its own (small) run (the one resume policy of [`Trainer`][app_common.harness.Trainer], checked in every
app) and [`assert_app_contract`][app_common.testing.assert_app_contract] with its parser and import name:
[`assert_vocabulary`][app_common.testing.assert_vocabulary] (one flag, one meaning) and the import-cycle
check every package shares,
[`spectraformer_core.testing.assert_no_import_cycle`][spectraformer_core.testing.assert_no_import_cycle].
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from app_common.config import flag
from app_common.records import CHECKPOINT, LOG, RECORD, RUNS
from app_common.results import read_jsonl
from app_common.vocabulary import ALIASES, FLAGS
from spectraformer_core.testing import assert_no_import_cycle

#: Record keys that differ between two runs of one configuration (wall-clock readings).
CLOCK_KEYS = ("train_seconds", "finished_at", "peak_memory_bytes")


class Killed(Exception):
    """Raised by `kill_at`'s hook: stands for the process being killed."""


def kill_at(step: int) -> Callable[[int], None]:
    """An ``on_save`` hook of [`Checkpointer`][app_common.checkpoint.Checkpointer] that raises `Killed`.

    It raises once the checkpoint of ``step`` is on disk, leaving the run as a kill right after it would.
    """

    def hook(at: int) -> None:
        if at == step:
            raise Killed(f"killed after the checkpoint of step {step}")

    return hook


def _plain(value: Any, out: Path, clock: tuple[str, ...] = CLOCK_KEYS) -> Any:
    """``value`` with the output folder's path replaced by ``<out>`` and the ``clock`` keys dropped."""
    if isinstance(value, Mapping):
        return {k: _plain(v, out, clock) for k, v in value.items() if k not in clock}
    if isinstance(value, list | tuple):
        return [_plain(v, out, clock) for v in value]
    if isinstance(value, str):
        return value.replace(str(out), "<out>")
    return value


def _tensors_equal(a: Any, b: Any, where: str) -> None:
    if isinstance(a, torch.Tensor):
        if not (isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype):
            raise AssertionError(f"{where}: {a.shape} {a.dtype} vs {b!r:.80}")
        assert torch.equal(a, b), f"{where}: differs (max abs {float((a.float() - b.float()).abs().max())})"
    elif isinstance(a, Mapping):
        if not (isinstance(b, Mapping) and set(a) == set(b)):
            raise AssertionError(f"{where}: keys {sorted(a)} != {sorted(b) if isinstance(b, Mapping) else b}")
        for k in a:
            _tensors_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        if not (isinstance(b, list | tuple) and len(a) == len(b)):
            raise AssertionError(f"{where}: lengths differ")
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _tensors_equal(x, y, f"{where}[{i}]")


def run_files(out: Path) -> dict[str, dict[str, Any]]:
    """Every run under ``out/runs``: its log lines, record and checkpoint (model, optimizers, state)."""
    found: dict[str, dict[str, Any]] = {}
    for folder in sorted((Path(out) / RUNS).iterdir()):
        checkpoint = (
            torch.load(folder / CHECKPOINT, weights_only=True) if (folder / CHECKPOINT).is_file() else {}
        )
        record_path = folder / RECORD
        found[folder.name] = {
            "log": read_jsonl(folder / LOG, missing_ok=True),
            "record": json.loads(record_path.read_text()) if record_path.is_file() else None,
            "weights": {k: checkpoint.get(k) for k in ("model", "optimizers", "state", "step")},
        }
    return found


def assert_resume_equals_unbroken(
    run: Callable[[Path, Callable[[int], None] | None], Any],
    tmp_path: Path,
    *,
    kill_step: int,
    clock_keys: tuple[str, ...] = (),
) -> None:
    """A run killed right after its checkpoint of ``kill_step`` and resumed ends as the unbroken run.

    Compares, for every run folder under ``out/runs``: the weights, optimizer states and extra state of
    the final checkpoint (bit for bit), the log lines and the record (bar `CLOCK_KEYS` and the output
    folder's path).

    Args:
        run: ``(out, on_save) -> anything``: the app's run (or grid) writing under ``out``, with
            ``on_save`` as the harness's checkpoint hook (None: no hook).
        tmp_path: a fresh folder (two output folders are made in it).
        kill_step: the checkpoint after which the first attempt is killed (it must exist).
        clock_keys: further record keys (at any depth) that are wall-clock readings (throughput).
    """
    unbroken, broken = tmp_path / "unbroken", tmp_path / "broken"
    run(unbroken, None)
    try:
        run(broken, kill_at(kill_step))
    except Killed:
        pass
    else:  # the hook never fired
        raise AssertionError(f"the run saved no checkpoint at step {kill_step}: nothing was killed")
    run(broken, None)
    a, b = run_files(unbroken), run_files(broken)
    assert set(a) == set(b), f"runs {sorted(a)} != {sorted(b)}"
    clock = CLOCK_KEYS + tuple(clock_keys)
    for name in a:
        assert a[name]["record"] is not None, f"{name}: the unbroken run wrote no record"
        _tensors_equal(a[name]["weights"], b[name]["weights"], f"{name} checkpoint")
        assert _plain(a[name]["log"], unbroken) == _plain(b[name]["log"], broken), f"{name}: log lines differ"
        records = [_plain(x[name]["record"], folder, clock) for x, folder in ((a, unbroken), (b, broken))]
        _records_equal(records[0], records[1], name)


def _records_equal(a: Any, b: Any, where: str) -> None:
    """Equal plain values; the message names the first key path that differs."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in sorted(set(a) | set(b)):
            _records_equal(a.get(key), b.get(key), f"{where}.{key}")
    elif a != b:
        raise AssertionError(f"record {where}: {a!r:.200} != {b!r:.200}")


def _subcommands(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:  # aliases share the parser
                    seen.add(id(sub))
                    yield from _subcommands(sub, f"{path} {name}")


#: Subcommands every app has.
REQUIRED_COMMANDS = ("train", "quick", "report", "list")


#: Markup that has no place in ``--help``: reST literals (````x````), roles (``:func:`x```) and
#: cross-reference links (``[x][y]``); ``app_common.cli.plain_text`` removes them from docstrings.
MARKUP = re.compile(r"``|:\w+:`|\]\[")


def vocabulary_problems(parser: argparse.ArgumentParser) -> list[str]:
    """What an app's command line breaks of the shared vocabulary (empty when it keeps to it).

    Checks every subcommand: no flag is an alias of a vocabulary flag (`app_common.vocabulary.ALIASES`), every
    vocabulary flag's help starts with its one meaning (`app_common.vocabulary.FLAGS`, what
    `app_common.fields.option` writes), every subcommand's ``--help`` is plain text (no reST literals or
    roles, no cross-reference links: `MARKUP`), and the app has the subcommands of `REQUIRED_COMMANDS`.
    """
    problems = []
    commands = dict(_subcommands(parser, parser.prog))
    top = {path.split()[-1] for path in commands if " " in path}
    problems += [f"{parser.prog}: no {name!r} subcommand" for name in REQUIRED_COMMANDS if name not in top]
    meanings = {flag(name): text for name, text in FLAGS.items()}
    for path, sub in commands.items():
        markup = MARKUP.search(sub.format_help())
        if markup:
            problems.append(f"{path}: --help shows markup {markup.group(0)!r}; expected plain text")
        for action in sub._actions:
            for option in action.option_strings:
                if option in ALIASES:
                    problems.append(f"{path}: {option} is spelled {ALIASES[option]} in every app")
                elif option in meanings:
                    text = " ".join((action.help or "").split())
                    if not text.startswith(meanings[option]):
                        problems.append(f"{path}: {option} means {text!r}, not {meanings[option]!r}")
    return problems


def assert_vocabulary(parser: argparse.ArgumentParser) -> None:
    """Fail, listing every problem, when ``parser`` breaks the flag vocabulary (`vocabulary_problems`)."""
    problems = vocabulary_problems(parser)
    if problems:
        raise AssertionError("flag vocabulary:\n" + "\n".join(problems))


def assert_app_contract(parser: argparse.ArgumentParser, package: str) -> None:
    """Fail when an app breaks what every app keeps to (its suite's one contract test).

    Args:
        parser: the app's parser: the flag vocabulary and the required subcommands (`assert_vocabulary`).
        package: the app's import name: no import cycle among its modules (``spectraformer_core.testing``).
    """
    assert_vocabulary(parser)
    assert_no_import_cycle(package)
