"""What the tests of every package share: relative errors, rounding tolerances, seeded draws, no cycle.

The comparison in the style of flash-linear-attention's tests: one number per comparison, the norm of the
difference over the norm of the reference, so a tolerance means the same at every shape and scale, and a
failure says how far off the result is.

The import graph counts every import wherever it stands: one inside a function or under ``TYPE_CHECKING``
is an edge like any other, so two modules that need each other share a third, leaf module instead. Every
package's, app's and the benchmarks' test suite runs
[`assert_no_import_cycle`][spectraformer_core.testing.assert_no_import_cycle] on its import name.
"""

from __future__ import annotations

import ast
import importlib.util
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch


def relative_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    """``||actual - reference|| / ||reference||`` in float64 (Frobenius norms over all elements).

    Args:
        actual: the result, any shape, on any device (it is compared on the reference's device).
        reference: what it should be, the same shape.

    Returns:
        The relative error; ``||actual||`` when the reference is all zeros (so 0 when both are), and NaN
        when either holds a NaN.

    Raises:
        ValueError: the shapes differ (broadcasting would hide a wrong shape).
    """
    if actual.shape != reference.shape:
        raise ValueError(
            f"actual: expected the shape of reference {tuple(reference.shape)}, got {tuple(actual.shape)}"
        )
    reference = reference.detach().double()
    actual = actual.detach().to(device=reference.device, dtype=torch.float64)
    scale = torch.linalg.vector_norm(reference)
    difference = torch.linalg.vector_norm(actual - reference)
    return float(difference / scale) if scale > 0 else float(torch.linalg.vector_norm(actual))


def assert_rel_close(name: str, reference: torch.Tensor, actual: torch.Tensor, ratio: float) -> None:
    """Assert that ``actual`` is within relative error ``ratio`` of ``reference``.

    Args:
        name: what is compared, for the failure message (``"output"``, ``"dq float32"``).
        reference: the plain or exact form's result.
        actual: the result under test, the same shape.
        ratio: the largest allowed [`relative_error`][spectraformer_core.testing.relative_error].

    Raises:
        AssertionError: the relative error exceeds ``ratio`` or is NaN; the message gives both numbers and
            the reference's norm, e.g. ``output: relative error 3.1e-02 > tolerance 1.0e-02
            (||reference|| = 4.2, shape (2, 8))``.
    """
    error = relative_error(actual, reference)
    if not error <= ratio:  # also NaN
        scale = float(torch.linalg.vector_norm(reference.detach().double()))
        raise AssertionError(
            f"{name}: relative error {error:.1e} > tolerance {ratio:.1e} "
            f"(||reference|| = {scale:.3g}, shape {tuple(reference.shape)})"
        )


#: Higham and Mary's probabilistic rounding-error constant: each rounding error of a sum is at most the unit
#: roundoff, independent and of mean zero, so the sum's error exceeds ``lambda sqrt(n) u sum |x_i|`` with
#: probability below ``2 n exp(-lambda^2 / 2)`` (``8e-8 n`` at 6).
ROUNDING_LAMBDA = 6.0


def rounding_tolerance(dtype: torch.dtype, length: int, condition: float = 1.0) -> float:
    r"""The relative difference allowed between two float computations of one result that sum in other orders.

    Two machines (AVX2 and AVX-512 kernels block their sums differently), or two code paths, each stay within
    $\lambda \sqrt{n}\, u \sum_i |x_i|$ of the exact sum (Higham and Mary 2019, ``ROUNDING_LAMBDA``), so
    they differ by at most $2 \lambda \sqrt{n}\, u\, \kappa = \lambda \sqrt{n}\, \epsilon\, \kappa$ relative
    to the result, with $u = \epsilon / 2$ the unit roundoff and $\kappa = \sum_i |x_i| / |\sum_i x_i|$.
    Independent of the machine: never the error one machine printed.

    Args:
        dtype: the floating dtype both computations run in.
        length: ``n``, the roundings each term goes through: the summed lengths of the nested sums (keys
            ``N``, then features ``m``: ``N + m``).
        condition: ``kappa``: 1 for sums of terms of one sign (positive features' normalizer); for signed
            features the normalizer's ``|phi_q| . sum |phi_k| / |D|``.
    """
    return ROUNDING_LAMBDA * math.sqrt(length) * torch.finfo(dtype).eps * condition


def seeded_randn(
    *shape: int, seed: int = 0, scale: float = 1.0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``scale`` times standard-normal draws of ``shape`` from their own generator seeded by ``seed``.

    The same ``seed`` gives the same tensor whatever ran before (the global RNG is not touched).
    """
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype) * scale


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(count)``; the previous count is restored after it.

    Loops of tiny operations (token-by-token decoding, operation counts) are fastest on one thread.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _modules(package: str) -> dict[str, Path]:
    """Module name -> source file, for ``package`` and every module below it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"package: {package!r} is not an installed package")
    root = Path(next(iter(spec.submodule_search_locations)))
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(module: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The modules of ``modules`` that ``module``'s source imports, at any depth of its syntax tree.

    A relative import is resolved against ``module``'s package. ``from p import m`` is an edge to ``p.m``
    when that is a module, else to ``p``; ``from p.m import name`` and ``import p.m`` are edges to ``p.m``
    alone, not to the packages above it; a name that is no module counts as the nearest module above it.
    """

    def owner(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    names: set[str] = set()
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(owner(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parent = node.module or ""
            if node.level:
                head = base[: len(base) - node.level + 1]
                parent = ".".join([*head, parent] if parent else head)
            names.update(owner(f"{parent}.{alias.name}") for alias in node.names)
    return {name for name in names if name and name != module}


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (every import statement, wherever it stands).

    The sources are read, nothing is imported. ``package`` is an import name (``"ralimp"``).

    Raises:
        ValueError: ``package`` is not an installed package.
    """
    modules = _modules(package)
    return {module: _imported(module, path, modules) for module, path in modules.items()}


def import_cycles(package: str) -> list[list[str]]:
    """The import cycles inside ``package``: each strongly connected group of two or more modules, sorted."""
    graph = import_graph(package)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def assert_no_import_cycle(package: str) -> None:
    """Fail, naming each cycle, when modules of ``package`` import each other (every import counts).

    Raises:
        AssertionError: one or more cycles, e.g. ``pkg: import cycles pkg.a <-> pkg.b``.
    """
    cycles = import_cycles(package)
    if cycles:
        raise AssertionError(f"{package}: import cycles " + "; ".join(" <-> ".join(c) for c in cycles))
