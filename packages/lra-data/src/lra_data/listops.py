"""ListOps: the LRA generator's rules, the release's string format, and an evaluator.

An expression is a tree: a node is a digit ``0``-``9`` or an operator applied to 2 to ``max_args``
arguments, written ``[OP a1 a2 ... ]``. The operators are ``MAX``, ``MIN``, ``MED`` (the median, truncated
to an integer: ``int(median)``) and ``SM`` (the sum modulo 10). The release nests each operator's
arguments as a left-leaning binary tree in parentheses: ``[MAX 2 9 ]`` is written
``( ( ( [MAX 2 ) 9 ) ] )``.
"""

from __future__ import annotations

import csv
import random
import statistics
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lra_data.tokenizers import LISTOPS_CLOSE, listops_symbols
from spectraformer_core import check_int

_LRA_OPERATOR_ORDER = ("[MIN", "[MAX", "[MED", "[SM")  # the order of the LRA code's OPERATORS list

_APPLY: dict[str, Callable[[list[int]], int]] = {
    "[MAX": max,
    "[MIN": min,
    "[MED": lambda args: int(statistics.median(args)),
    "[SM": lambda args: sum(args) % 10,
}

Tree = int | tuple[Any, Any]
"""A generated expression: a digit, or nested pairs ``((op, a1), a2), ..., "]")`` as in the LRA code."""


@dataclass(frozen=True)
class ListOpsConfig:
    """Rules of the ListOps generator (defaults: the LRA's).

    Attributes:
        max_depth: a node at this depth is always a digit (the root has depth 1).
        max_args: an operator takes 2 to ``max_args`` arguments, uniformly.
        min_length: an expression is kept only if its length exceeds this (exclusive bound).
        max_length: ... and is below this (exclusive bound). The length counts operators, digits and ``]``
            (the tokens), not parentheses.
        operator_prob: probability that a node above ``max_depth`` is an operator (else a digit). The LRA
            code draws ``r`` uniform and makes a digit when ``r > 0.25``, so 0.25.
    """

    max_depth: int = 10
    max_args: int = 10
    min_length: int = 500
    max_length: int = 2000
    operator_prob: float = 0.25

    def __post_init__(self) -> None:
        check_int("max_depth", self.max_depth, 1)
        check_int("max_args", self.max_args, 2)
        check_int("min_length", self.min_length, 0)
        check_int("max_length", self.max_length, None)
        if not 0.0 <= self.operator_prob <= 1.0:
            raise ValueError(f"operator_prob: expected a probability in [0, 1], got {self.operator_prob}")
        if self.max_length <= self.min_length + 1:
            raise ValueError(
                f"min_length, max_length: expected 0 <= min_length < max_length - 1 (both exclusive), "
                f"got {self.min_length}, {self.max_length}"
            )
        longest = 1
        for _ in range(self.max_depth - 1):
            longest = 2 + self.max_args * longest
        if longest <= self.min_length:
            raise ValueError(
                f"min_length: no expression of depth <= {self.max_depth} with <= {self.max_args} arguments "
                f"is longer than {longest}, got min_length={self.min_length}"
            )


def generate_tree(rng: random.Random, config: ListOpsConfig, depth: int = 1) -> tuple[Tree, int]:
    """One random expression and its length, drawn as the LRA's ``generate_tree`` does.

    Args:
        rng: the source of randomness.
        config: the generator's rules.
        depth: depth of this node (1 for the root).

    Returns:
        ``(tree, length)``; the tree is a digit or nested pairs as the LRA code builds them.
    """
    # Same draws, in the same order, as the LRA code: r, then the digit or the argument count, the
    # arguments, and the operator last.
    if depth >= config.max_depth or rng.random() > config.operator_prob:
        return rng.randrange(10), 1
    length = 2
    args = []
    for _ in range(rng.randint(2, config.max_args)):
        arg, arg_length = generate_tree(rng, config, depth + 1)
        args.append(arg)
        length += arg_length
    tree: Tree = (rng.choice(_LRA_OPERATOR_ORDER), args[0])
    for arg in args[1:]:
        tree = (tree, arg)
    return (tree, LISTOPS_CLOSE), length


def tree_to_string(tree: Tree) -> str:
    """The release's parenthesized string of a tree: ``( ( ( [MAX 2 ) 9 ) ] )``."""
    if isinstance(tree, int | str):
        return str(tree)
    return f"( {tree_to_string(tree[0])} {tree_to_string(tree[1])} )"


def tree_value(tree: Tree) -> int:
    """The value of a tree, by walking its nested pairs as the LRA's ``to_value`` does."""

    def walk(t: Any) -> Any:
        if not isinstance(t, tuple):
            return t
        left, right = walk(t[0]), walk(t[1])
        if (
            isinstance(left, str) and left in _APPLY
        ):  # an operator with its first argument: an open application
            return (left, [right])
        if right == LISTOPS_CLOSE:  # closing an open application
            return _APPLY[left[0]](left[1])
        return (left[0], [*left[1], right])  # one more argument

    return int(walk(tree))


def evaluate_listops(source: str) -> int:
    """The value of a ListOps expression, read from its symbols alone (parentheses are ignored).

    This reads the token sequence a model sees, with a stack, independently of how it was generated.

    Raises:
        ValueError: unknown symbols, an operator without arguments or ``]``, a ``]`` with no open
            operator, or more than one expression.
    """
    stack: list[tuple[str, list[int]]] = []
    result: int | None = None
    for position, symbol in enumerate(listops_symbols(source)):
        if symbol in _APPLY:
            stack.append((symbol, []))
            continue
        if symbol == LISTOPS_CLOSE:
            if not stack:
                raise ValueError(f"source: ']' at symbol {position} closes no operator")
            op, args = stack.pop()
            if not args:
                raise ValueError(f"source: operator {op} closed at symbol {position} without arguments")
            value = _APPLY[op](args)
        else:
            value = int(symbol)
        if stack:
            stack[-1][1].append(value)
        elif result is None:
            result = value
        else:
            raise ValueError(f"source: a second expression starts at symbol {position}")
    if stack:
        raise ValueError(f"source: {len(stack)} operator(s) not closed by ']'")
    if result is None:
        raise ValueError("source: expected an expression, got no symbols")
    return result


def iter_listops(
    n: int, *, seed: int, config: ListOpsConfig | None = None, max_attempts: int | None = None
) -> Iterator[tuple[str, int]]:
    """Yield ``n`` expressions ``(source, label)`` one at a time; see `generate_listops`."""
    check_int("n", n, 0)
    config = config or ListOpsConfig()
    rng = random.Random(seed)
    limit = 1000 * n + 100_000 if max_attempts is None else max_attempts
    made = 0
    for _ in range(limit):
        if made == n:
            return
        tree, length = generate_tree(rng, config)
        if config.min_length < length < config.max_length:
            made += 1
            yield tree_to_string(tree), tree_value(tree)
    if made < n:
        raise RuntimeError(
            f"generate_listops: only {made} of {n} expressions had a length in "
            f"({config.min_length}, {config.max_length}) after {limit} draws with {config}"
        )


def generate_listops(
    n: int,
    *,
    seed: int,
    max_depth: int = 10,
    max_args: int = 10,
    min_length: int = 500,
    max_length: int = 2000,
    operator_prob: float = 0.25,
    max_attempts: int | None = None,
) -> list[tuple[str, int]]:
    """``n`` random ListOps expressions in the release's format, with their values as labels.

    Follows the LRA generator: draw trees ([`generate_tree`][lra_data.generate_tree]) and keep those whose
    length (operators, digits and ``]``) lies strictly between ``min_length`` and ``max_length``; the label is
    the tree's value. The same ``seed`` gives the same list on every run and machine.

    Args:
        n: number of expressions.
        seed: seed of the random stream (``random.Random(seed)``).
        max_depth: see [`ListOpsConfig`][lra_data.ListOpsConfig].
        max_args: see [`ListOpsConfig`][lra_data.ListOpsConfig].
        min_length: see [`ListOpsConfig`][lra_data.ListOpsConfig].
        max_length: see [`ListOpsConfig`][lra_data.ListOpsConfig].
        operator_prob: see [`ListOpsConfig`][lra_data.ListOpsConfig].
        max_attempts: trees drawn at most before giving up (default ``1000 * n + 100000``).

    Returns:
        ``[(source, label), ...]`` with ``source`` like ``"( ( ( [MAX 2 ) 9 ) ] )"`` and label in 0..9.

    Raises:
        ValueError: ``n`` negative, or rules no expression can satisfy.
        RuntimeError: fewer than ``n`` trees fit the length bounds within ``max_attempts`` draws.
    """
    config = ListOpsConfig(max_depth, max_args, min_length, max_length, operator_prob)
    return list(iter_listops(n, seed=seed, config=config, max_attempts=max_attempts))


def write_listops_tsv(examples: Iterable[tuple[str, int]], path: str | Path) -> Path:
    """Write ``(source, label)`` pairs as a release TSV: header ``Source<TAB>Target``, one pair a line."""
    path = Path(path)
    with path.open("w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["Source", "Target"])
        for source, label in examples:
            writer.writerow([source, label])
    return path
