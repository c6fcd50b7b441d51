"""Test, lint and docs sessions of the spectraformer workspace (nox on its uv backend).

Every workspace member (``packages/*``, ``apps/*``) gets a session ``tests-<name>`` that installs only that
member and what it declares (``uv sync --frozen --package <name>``), so an undeclared import fails there.
``tests-all`` runs every test with every member installed; ``lint`` and ``docs`` check style and the site.
``uv run --frozen nox`` runs them all (the default sessions); ``uv run --frozen nox -l`` lists them.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).parent
nox.options.default_venv_backend = "uv"
nox.options.error_on_missing_interpreters = True


def workspace_members() -> dict[str, Path]:
    """Distribution name -> folder of every workspace member, read from the root pyproject's globs."""
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    members = {}
    for pattern in root["tool"]["uv"]["workspace"]["members"]:
        for pyproject in sorted(ROOT.glob(f"{pattern}/pyproject.toml")):
            name = tomllib.loads(pyproject.read_text())["project"]["name"]
            members[name] = pyproject.parent.relative_to(ROOT)
    return members


def sync(session: nox.Session, *args: str) -> None:
    """Install from uv.lock exactly into the session's virtual environment."""
    session.run_install(
        "uv",
        "sync",
        "--frozen",
        "--no-default-groups",
        *args,
        env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location},
        external=True,
    )


MEMBERS = workspace_members()


def _member_session(name: str, folder: Path):
    @nox.session(name=f"tests-{name}", default=True)
    def tests(session: nox.Session) -> None:
        sync(session, "--package", name, "--group", "test")
        session.run("pytest", str(folder / "tests"), *session.posargs)

    tests.__doc__ = f"Run the tests of {name} with only {name} and its declared dependencies installed."
    return tests


for _name, _folder in MEMBERS.items():
    _member_session(_name, _folder)


@nox.session(name="tests-all", default=True)
def tests_all(session: nox.Session) -> None:
    """Run every member's tests together, with the whole workspace and its optional extras installed."""
    sync(session, "--all-packages", "--all-extras", "--group", "test")
    session.run("pytest", *[str(folder / "tests") for folder in MEMBERS.values()], *session.posargs)


@nox.session(default=True)
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole tree."""
    sync(session, "--only-group", "lint")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(default=True)
def docs(session: nox.Session) -> None:
    """Build the mkdocs-material site with --strict (every warning fails)."""
    sync(session, "--only-group", "docs")
    session.run("mkdocs", "build", "--strict", *session.posargs, env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Speed and memory benchmarks (not a test): tables on stdout, the docs' plot under docs/img/."""
    sync(session, "--all-packages", "--group", "bench")
    session.run("python", "benchmarks/structured_transform.py")
    session.run(
        "python",
        "benchmarks/attention_scaling.py",
        "--plot",
        "docs/img/attention_scaling.png",
        *session.posargs,
    )
    session.run("python", "benchmarks/ralimp_layer.py")
