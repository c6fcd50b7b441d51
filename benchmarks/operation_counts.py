"""Operations per training step: the aten calls one forward+backward of an attention module dispatches.

A ``TorchDispatchMode`` counts every aten operator call (views included) of one forward+backward of
``rf_attention.create(name, dim, heads, num_features=...)`` on ``x (B, N, dim)``: a hardware-free stand-in for
the kernel launches the same step issues on a GPU (each a few microseconds there, whatever its size). A
kernel whose count grows with N cannot beat softmax attention at long context on a GPU. The counts are
deterministic (no timing, no dependence on the input values): only how many operators are called matters,
not how much work each does.

    python benchmarks/operation_counts.py                                 # every pair, 1K/4K/16K
    python benchmarks/operation_counts.py --attentions posrf-orf softmax --lengths 1024 16384
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import rf_attention

DEFAULT_LENGTHS = [1024, 4096, 16384]
#: The goals: at most this many operations per forward+backward at the longest length ...
MAX_OPERATIONS = 1000
#: ... and at most this multiple of the count at the shortest length.
MAX_GROWTH = 1.5


class OperationCounter(TorchDispatchMode):
    """Counts the aten operator calls dispatched while active (``counts[name]``, ``total``)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.counts[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        """Operator calls counted so far."""
        return sum(self.counts.values())


def rf_pairs() -> list[str]:
    """Every ``<component>-<matrix>`` pair of the registry (the baselines left out)."""
    import rf_features
    import rf_matrices

    components, matrices = set(rf_features.names()), set(rf_matrices.names())
    return [
        name
        for name in rf_attention.names()
        if any(name.startswith(f"{c}-") and name[len(c) + 1 :] in matrices for c in components)
    ]


def count_step(
    name: str, n: int, *, causal: bool, batch: int, dim: int, heads: int, features: int
) -> collections.Counter[str]:
    """Aten calls of one training forward+backward of attention ``name`` on ``x (batch, n, dim)``."""
    torch.manual_seed(0)
    module = rf_attention.create(name, dim, heads, num_features=features, causal=causal, seed=0).train()
    x = torch.randn(batch, n, dim, requires_grad=True)
    module(x[:, : min(n, 64)]).sum().backward()  # first call: lazily built constants are not counted
    with OperationCounter() as counter:
        module(x).sum().backward()
    return counter.counts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attentions", nargs="+", default=None, help="default: softmax and every RF pair")
    parser.add_argument("--lengths", type=int, nargs="+", default=DEFAULT_LENGTHS)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--causal", choices=["both", "no", "yes"], default="both")
    parser.add_argument("--out", type=Path, default=None, help="also write the counts here (JSON)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Print a Markdown table of operations per forward+backward, each row's goals met or missed."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    names = args.attentions or ["softmax", *rf_pairs()]
    modes = {"both": [False, True], "no": [False], "yes": [True]}[args.causal]
    lengths = sorted(args.lengths)
    print(
        f"Operations (aten calls) per forward+backward, x ({args.batch}, N, {args.dim}), {args.heads} heads, "
        f"{args.features} features; goals: <= {MAX_OPERATIONS} at N = {lengths[-1]} and <= {MAX_GROWTH}x "
        f"the count at N = {lengths[0]}\n"
    )
    print("| attention | " + " | ".join(f"N = {n}" for n in lengths) + " | growth | goals |")
    print("|---|" + "---|" * (len(lengths) + 2))
    rows, misses = [], 0
    for name in names:
        for causal in modes:
            label = f"{name} causal" if causal else name
            totals = []
            for n in lengths:
                counts = count_step(
                    name,
                    n,
                    causal=causal,
                    batch=args.batch,
                    dim=args.dim,
                    heads=args.heads,
                    features=args.features,
                )
                totals.append(sum(counts.values()))
            growth = totals[-1] / totals[0]
            met = totals[-1] <= MAX_OPERATIONS and growth <= MAX_GROWTH
            misses += not met
            cells = " | ".join(f"{t:,}" for t in totals)
            print(f"| {label} | {cells} | {growth:.2f}x | {'met' if met else 'MISSED'} |", flush=True)
            rows.append({"attention": name, "causal": causal, "lengths": lengths, "operations": totals})
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1))
    print(f"\n{len(rows) - misses} of {len(rows)} rows meet both goals")


if __name__ == "__main__":
    main()
