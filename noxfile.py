"""Test, lint and docs sessions of the spectraformer workspace (nox on its uv backend).

Every workspace member (``packages/*``, ``apps/*``) gets a session ``tests-<name>`` that installs only that
member and what it declares (``uv sync --frozen --package <name>``), so an undeclared import fails there.
``tests-all`` runs every test with every member installed; ``lint`` and ``docs`` check style and the site.
``workspace-deps`` checks that every dependency on a member is satisfied from the workspace; ``wheels`` and
``pip-install`` install one package and one app the way a pip user does (see docs/install.md).
``uv run --frozen nox`` runs them all (the default sessions); ``uv run --frozen nox -l`` lists them.
"""

from __future__ import annotations

import tomllib
from graphlib import TopologicalSorter
from pathlib import Path

import nox
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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


def member_pyproject(name: str) -> dict:
    """The parsed pyproject.toml of workspace member ``name``."""
    return tomllib.loads((ROOT / MEMBERS[name] / "pyproject.toml").read_text())


def requirements(pyproject: dict) -> list[Requirement]:
    """Every requirement a pyproject declares: dependencies, optional dependencies, dependency groups."""
    project = pyproject.get("project", {})
    lines = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        lines += extra
    for group in pyproject.get("dependency-groups", {}).values():
        lines += [line for line in group if isinstance(line, str)]
    return [Requirement(line) for line in lines]


def member_dependencies(name: str) -> list[str]:
    """The workspace members that member ``name`` requires at run time (``[project] dependencies``)."""
    deps = member_pyproject(name)["project"].get("dependencies", [])
    return [dep for dep in (canonicalize_name(Requirement(line).name) for line in deps) if dep in MEMBERS]


def install_order(targets: list[str]) -> list[str]:
    """``targets`` and the members they need, each after everything it depends on."""
    graph: dict[str, list[str]] = {}
    todo = list(targets)
    while todo:
        name = todo.pop()
        if name not in graph:
            graph[name] = member_dependencies(name)
            todo += graph[name]
    return list(TopologicalSorter(graph).static_order())


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
#: pytest-xdist: the tests of a session run in one worker process per CPU core.
PARALLEL = ("--numprocesses", "auto")
#: One torch (OpenMP) thread per worker: the workers already fill the cores, and torch's default of one
#: thread per core in every worker oversubscribes them (ralimp's tests took 190 s instead of 47 s on 2 cores).
WORKER_ENV = {"OMP_NUM_THREADS": "1"}


def _member_session(name: str, folder: Path):
    @nox.session(name=f"tests-{name}", default=True)
    def tests(session: nox.Session) -> None:
        sync(session, "--package", name, "--group", "test")
        session.run(
            "pytest", str(folder / "tests"), "-m", "not slow", *PARALLEL, *session.posargs, env=WORKER_ENV
        )

    tests.__doc__ = (
        f"Run the tests of {name} with only {name} and its declared dependencies installed (the slow ones "
        "run in tests-all)."
    )
    return tests


for _name, _folder in MEMBERS.items():
    _member_session(_name, _folder)


@nox.session(name="tests-all", default=True)
def tests_all(session: nox.Session) -> None:
    """Run every member's tests together, with the whole workspace and its optional extras installed."""
    sync(session, "--all-packages", "--all-extras", "--group", "test")
    tests = [str(folder / "tests") for folder in MEMBERS.values()]
    session.run("pytest", *tests, *PARALLEL, *session.posargs, env=WORKER_ENV)


@nox.session(name="tests-triton", default=True)
def tests_triton(session: nox.Session) -> None:
    """Run rf-attention's Triton kernels on CPU tensors (Triton's interpreter); compile them for sm_80/sm_90.

    ``TRITON_INTERPRET=1``; the other sessions skip these tests (they need it or a CUDA device).
    """
    sync(session, "--package", "rf-attention", "--group", "test")
    tests = [
        "packages/rf-attention/tests/test_triton.py",
        "packages/rf-attention/tests/test_triton_compile.py",
    ]
    session.run("pytest", *tests, *PARALLEL, *session.posargs, env={**WORKER_ENV, "TRITON_INTERPRET": "1"})


@nox.session(default=True)
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole tree."""
    sync(session, "--only-group", "lint")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(default=True)
def docs(session: nox.Session) -> None:
    """Build the site with --strict, then run the pages' code (tests/docs).

    The build fails on any warning, broken links and anchors included (``validation`` in mkdocs.yml). The
    whole workspace with its extras is installed because the pages' runnable snippets import it
    (``rf_attention.hf`` needs transformers).
    """
    sync(session, "--all-packages", "--all-extras", "--group", "docs", "--group", "test")
    session.run("mkdocs", "build", "--strict", env={"NO_MKDOCS_2_WARNING": "1"})
    session.run("pytest", "tests/docs", *PARALLEL, *session.posargs, env=WORKER_ENV)


@nox.session(default=True)
def typecheck(session: nox.Session) -> None:
    """mypy, strict, on the packages listed in [tool.mypy] of the root pyproject."""
    sync(session, "--all-packages", "--all-extras", "--group", "typecheck")
    session.run("mypy", *session.posargs)


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Every benchmark at its defaults (not a test): tables on stdout, plots under results/bench/.

    The benchmarks are the workspace member ``spectraformer-benchmarks`` (``benchmarks/``), each a module
    run with ``python -m``. The figures on the docs' pages come from the commands printed beside them
    (the causal table from ``benchmarks/run_causal_table.sh``), not from this session.
    """
    sync(session, "--package", "spectraformer-benchmarks")

    def module(name: str, *args: str) -> None:
        session.run("python", "-m", f"spectraformer_benchmarks.{name}", *args)

    module("structured_transform")
    module("operation_counts", "--batch", "1")
    module("attention_scaling", "--plot", "results/bench/attention_scaling.png", *session.posargs)
    module("causal", "--part", "flops", "--out", "results/bench/causal")
    module("ralimp_layer")


#: Names of workspace dependencies that belong to unrelated projects on PyPI (a pip user asking for one
#: gets a stranger's package): ``app-common`` is 1.0.7-1.0.9 of someone else, pulling MockSSH and Twisted.
FOREIGN_ON_PYPI = frozenset({"app-common"})


def workspace_dependency_problems() -> list[str]:
    """Why some dependency of a member would not be satisfied from the workspace (empty: none)."""
    problems = []
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    root_sources = root.get("tool", {}).get("uv", {}).get("sources", {})
    for name, folder in MEMBERS.items():
        if name in FOREIGN_ON_PYPI:
            problems.append(f"{folder}: the distribution name {name!r} is another project's on PyPI")
        pyproject = member_pyproject(name)
        sources = {**root_sources, **pyproject.get("tool", {}).get("uv", {}).get("sources", {})}
        sources = {canonicalize_name(key): value for key, value in sources.items()}
        for requirement in requirements(pyproject):
            dep = canonicalize_name(requirement.name)
            if dep in FOREIGN_ON_PYPI:
                problems.append(f"{folder}: requires {dep!r}, which on PyPI is an unrelated project")
            if dep in MEMBERS and sources.get(dep) != {"workspace": True}:
                problems.append(
                    f"{folder}: requires the member {dep!r} without `{dep} = {{ workspace = true }}` in "
                    f"[tool.uv.sources] (got {sources.get(dep)!r})"
                )
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    for package in lock["package"]:
        name = canonicalize_name(package["name"])
        source = package.get("source", {})
        if name in MEMBERS and not {"editable", "virtual", "directory"} & set(source):
            problems.append(f"uv.lock: the member {name!r} is locked from {source!r}, not from the workspace")
        if name in FOREIGN_ON_PYPI:
            problems.append(f"uv.lock: locks {name!r} from {source!r}, an unrelated project on PyPI")
    return problems


@nox.session(name="workspace-deps", python=False, default=True)
def workspace_deps(session: nox.Session) -> None:
    """Check that every dependency on a workspace member is declared and locked from the workspace."""
    problems = workspace_dependency_problems()
    if problems:
        session.error("dependencies not satisfied from the workspace:\n  " + "\n  ".join(problems))
    session.log(f"{len(MEMBERS)} members: every dependency on a member comes from the workspace")


#: What the install sessions import and run once installed: a tiny forward through each target.
SMOKE = {
    "rf-attention": (
        "import torch, rf_attention\n"
        "attn = rf_attention.create('oprf-fastfoodl', 16, 2, num_features=8, seed=0)\n"
        "y = attn(torch.randn(2, 5, 16))\n"
        "assert y.shape == (2, 5, 16) and bool(torch.isfinite(y).all()), y\n"
        "print('rf-attention: oprf-fastfoodl forward', tuple(y.shape))\n"
    ),
    "layer-fit": (
        "import torch, layer_fit\n"
        "data = layer_fit.make_data('gelu', samples=64, dim=16, seed=0)\n"
        "model = layer_fit.build('ralimp', 'gelu', 16, dim=16, seed=0, sample=data.x)\n"
        "y = model(data.x)\n"
        "assert y.shape == (64, 16) and bool(torch.isfinite(y).all()), y\n"
        "print('layer-fit: ralimp layer forward', tuple(y.shape))\n"
    ),
}


def locked_constraints(session: nox.Session) -> Path:
    """uv.lock's pins of every third-party package, as a pip constraints file (torch from uv's cache)."""
    path = Path(session.create_tmp()) / "constraints.txt"
    session.run(
        "uv", "export", "--frozen", "--all-packages", "--no-emit-workspace", "--no-hashes", "--quiet",
        "--output-file", str(path), external=True,
    )  # fmt: skip
    return path


def check_installed_from(session: nox.Session, names: list[str], where: str) -> None:
    """Each member in ``names`` is installed in the session's environment from a file below ``where``."""
    script = (
        "import importlib.metadata as m, json, sys\n"
        "for name in sys.argv[2:]:\n"
        "    url = json.loads(m.distribution(name).read_text('direct_url.json'))['url']\n"
        "    assert sys.argv[1] in url, f'{name} installed from {url}, not from {sys.argv[1]}'\n"
    )
    session.run("python", "-c", script, Path(where).resolve().as_uri(), *names)


@nox.session(default=True)
def wheels(session: nox.Session) -> None:
    """Wheels from ``uv build`` (rf-attention, layer-fit, their members) installed in order, then run.

    The wheels go one by one, in dependency order, into this session's fresh environment, so each one finds
    the members it needs already installed; then each target is imported and runs a tiny forward.
    """
    dist = Path(session.create_tmp()) / "dist"
    order = install_order(list(SMOKE))
    for name in order:
        session.run("uv", "build", "--package", name, "--wheel", "--out-dir", str(dist), external=True)
    constraints = locked_constraints(session)
    for name in order:
        (wheel,) = dist.glob(f"{name.replace('-', '_')}-*.whl")
        session.install("--constraint", str(constraints), str(wheel))
    check_installed_from(session, order, str(dist))
    for script in SMOKE.values():
        session.run("python", "-c", script)
    session.run("layer-fit", "--help", silent=True)


@nox.session(name="pip-install", default=False)
def pip_install(session: nox.Session) -> None:
    """``pip install`` rf-attention from its folder with its members in one command, as the docs say.

    Not a default session: pip builds each folder with hatchling fetched by pip itself (network or pip's
    own cache); ``wheels`` checks the same dependency story offline from uv's cache.
    """
    constraints = locked_constraints(session)
    # torch and numpy from uv's cache, at the locked versions, so that pip does not download them again.
    session.install("--constraint", str(constraints), "pip", "torch", "numpy")
    folders = [f"./{MEMBERS[name]}" for name in install_order(["rf-attention"])]
    session.run("python", "-m", "pip", "install", "--quiet", "--constraint", str(constraints), *folders)
    check_installed_from(session, install_order(["rf-attention"]), str(ROOT))
    session.run("python", "-c", SMOKE["rf-attention"])
