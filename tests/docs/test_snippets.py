"""Run the code of the documentation pages: every Python block is executed or says why it is not.

A fenced block is marked by an HTML comment on the line before its opening fence (blank lines between are
allowed; the comment does not show on the rendered page):

- ``<!-- runnable -->`` before a ``python`` block: the block runs on its own, in a fresh namespace, and the
  test fails on any exception (or warning: pytest turns warnings into errors in this workspace).
- ``<!-- runnable: continues -->`` before a ``python`` block: the block continues the runnable block before
  it on the same page (one file shown in parts): the parts run in order in one namespace, then every
  ``test_*`` function they define is called (``tmp_path`` given where it is a parameter).
- ``<!-- not-runnable: <why> -->`` before a ``python`` block: not run; the reason is required.
- ``<!-- cli-help -->`` before a ``bash`` block: every command in it must read
  ``uv run --frozen --package <member> <command> <arguments>``, where ``<member>`` is a workspace member that
  declares the console script ``<command>``; the test runs ``<command> <arguments> --help`` in this
  environment (the program, its subcommand and the arguments before ``--help`` parse; the full run is
  too long for a test).

A ``python`` block with neither mark fails `test_every_python_block_is_marked`, so no snippet is silently
left unexecuted. The ``docs`` nox session runs this file after ``mkdocs build --strict``.
"""

from __future__ import annotations

import linecache
import re
import shlex
import subprocess
import sys
import textwrap
import tomllib
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")
MARK = re.compile(r"^\s*<!--\s*(?P<mark>runnable|not-runnable|cli-help)\s*(?::\s*(?P<why>.*?))?\s*-->\s*$")
MARKS = ("runnable", "not-runnable", "cli-help")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page: its language, first line number, code and mark (or None)."""

    page: str
    line: int
    language: str
    code: str
    mark: str | None
    why: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    """Every fenced block of ``page`` with the mark on the nearest non-blank line before its fence."""
    lines = page.read_text(encoding="utf-8").splitlines()
    name = page.relative_to(DOCS).as_posix()
    found = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        language = (opening["info"].strip().split() or [""])[0].lower()
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = MARK.match(before)
        code = textwrap.dedent("\n".join(line.removeprefix(indent) for line in lines[i + 1 : end]))
        found.append(
            Block(name, i + 1, language, code, mark["mark"] if mark else None, (mark and mark["why"]) or "")
        )
        i = end + 1
    return found


PAGES = sorted(DOCS.rglob("*.md"))
BLOCKS = [block for page in PAGES for block in blocks_of(page)]
PYTHON = ("python", "py")


def test_the_pages_have_runnable_blocks() -> None:
    # Guards the parser: the home page and Getting started carry runnable snippets.
    pages = {block.page for block in BLOCKS if block.mark == "runnable"}
    assert {"index.md", "getting-started.md"} <= pages, pages


@pytest.mark.parametrize("page", [page.relative_to(DOCS).as_posix() for page in PAGES])
def test_every_python_block_is_marked(page: str) -> None:
    blocks = [block for block in BLOCKS if block.page == page and block.language in PYTHON]
    unmarked = [block.id for block in blocks if block.mark not in ("runnable", "not-runnable")]
    assert not unmarked, (
        f"Python blocks without <!-- runnable --> or <!-- not-runnable: why --> before them: {unmarked}"
    )
    for block in blocks:
        assert block.mark != "not-runnable" or block.why, f"{block.id}: not-runnable needs a reason"


@pytest.mark.parametrize("page", [page.relative_to(DOCS).as_posix() for page in PAGES])
def test_marks_sit_on_the_right_blocks(page: str) -> None:
    text = (DOCS / page).read_text(encoding="utf-8").splitlines()
    marks = sum(1 for line in text if MARK.match(line))
    blocks = [block for block in BLOCKS if block.page == page and block.mark is not None]
    assert marks == len(blocks), f"{page}: {marks} marks but {len(blocks)} marked blocks (a mark is astray)"
    for block in blocks:
        expected = ("bash",) if block.mark == "cli-help" else PYTHON
        assert block.language in expected, f"{block.id}: {block.mark} on a {block.language!r} block"


def runnable_chains(blocks: list[Block]) -> list[list[Block]]:
    """Runnable blocks grouped into the scripts they form: a ``continues`` block joins the one before it."""
    chains: list[list[Block]] = []
    for block in blocks:
        if block.mark != "runnable":
            continue
        if block.why == "continues":
            if not chains or chains[-1][-1].page != block.page:
                raise ValueError(f"{block.id}: 'runnable: continues' follows no runnable block of its page")
            chains[-1].append(block)
        else:
            chains.append([block])
    return chains


RUNNABLE = runnable_chains(BLOCKS)


@pytest.mark.parametrize("chain", RUNNABLE, ids=[chain[0].id for chain in RUNNABLE])
def test_runnable_block_runs(chain: list[Block], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A module of its own in sys.modules, as a script has: dataclasses and typing resolve its annotations.
    module = types.ModuleType("docs_snippet")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace = module.__dict__
    for block in chain:
        # Padded so that a traceback names the page and its line numbers, and shows the page's code.
        filename, source = f"docs/{block.page}", "\n" * block.line + block.code + "\n"
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        exec(compile(source, filename, "exec"), namespace)
    for name, value in list(namespace.items()):
        code = getattr(value, "__code__", None)
        if name.startswith("test_") and code is not None and code.co_filename.startswith("docs/"):
            value(**({"tmp_path": tmp_path} if "tmp_path" in code.co_varnames[: code.co_argcount] else {}))


def console_scripts() -> dict[str, str]:
    """Console script name -> the workspace member that declares it."""
    scripts = {}
    for pyproject in sorted(ROOT.glob("*/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        scripts.update(dict.fromkeys(project.get("scripts", {}), project["name"]))
    return scripts


def commands_of(code: str) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, comments dropped."""
    joined = code.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.split("#")[0].strip()]


CLI = [(block, cmd) for block in BLOCKS if block.mark == "cli-help" for cmd in commands_of(block.code)]


@pytest.mark.parametrize(
    ("block", "command"), CLI, ids=[f"{block.id}:{' '.join(command[5:7])}" for block, command in CLI]
)
def test_cli_command_parses(block: Block, command: list[str]) -> None:
    prefix, member, program, arguments = command[:4], command[4], command[5], command[6:]
    assert prefix == ["uv", "run", "--frozen", "--package"], f"{block.id}: {shlex.join(command)}"
    assert console_scripts().get(program) == member, f"{block.id}: {member!r} declares no script {program!r}"
    executable = Path(sys.executable).parent / program
    result = subprocess.run(
        [str(executable), *arguments, "--help"], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, f"{block.id}: {shlex.join(command)} --help\n{result.stderr[-2000:]}"
    assert "usage:" in result.stdout, result.stdout[:500]
