"""Operations per training step: the aten calls one forward+backward of an attention module dispatches.

`counting.OperationCounter` (a ``TorchDispatchMode``) counts every aten operator call (views included) of one
forward+backward of ``rf_attention.create(name, dim, heads, num_features=...)`` on ``x (B, N, dim)``: a
hardware-free stand-in for the kernel launches the same step issues on a GPU (each a few microseconds there,
whatever its size). A kernel whose count grows with N cannot beat softmax attention at long context on a
GPU. The counts are deterministic (no timing, no dependence on the input values): only how many operators
are called matters, not how much work each does.

``--decode`` counts instead one decoding ``step()`` of the causal module (``eval()``, after a prefill) of
every attention, against softmax's KV-cache step (the goal: at most softmax's count).

    python -m spectraformer_benchmarks.operation_counts                   # every pair, 1K/4K/16K
    python -m spectraformer_benchmarks.operation_counts --attentions posrf-orf softmax --lengths 1024 16384
    python -m spectraformer_benchmarks.operation_counts --batch 1 --causal yes --lengths 1024 65536
    python -m spectraformer_benchmarks.operation_counts --decode          # decode steps, every pair
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from spectraformer_benchmarks.common import rf_pairs
from spectraformer_benchmarks.counting import decode_step, operations, training_step

DEFAULT_LENGTHS = [1024, 4096, 16384]
#: The goals: at most this many operations per forward+backward at the longest length ...
MAX_OPERATIONS = 1000
#: ... and at most this multiple of the count at the shortest length.
MAX_GROWTH = 1.5


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
    parser.add_argument("--decode", action="store_true", help="count one decode step() per attention instead")
    parser.add_argument("--out", type=Path, default=None, help="also write the counts here (JSON)")
    return parser.parse_args(argv)


def decode_main(names: list[str], args: argparse.Namespace) -> list[dict]:
    """Print the table of operations per decode ``step()``, each against softmax's KV-cache step."""
    print(
        f"Operations (aten calls) per decode step() of a causal module in eval(), dim {args.dim}, "
        f"{args.heads} heads, {args.features} features, after a prefill; goal: <= softmax's KV-cache step\n"
    )
    counts = {
        name: operations(decode_step(name, dim=args.dim, heads=args.heads, features=args.features))
        for name in dict.fromkeys(["softmax", *names])
    }
    print("| attention | operations per step | / softmax's |")
    print("|---|---|---|")
    for name, count in counts.items():
        print(f"| {name} | {count:,} | {count / counts['softmax']:.2f}x |", flush=True)
    met = sum(count <= counts["softmax"] for name, count in counts.items() if name != "softmax")
    print(f"\n{met} of {len(counts) - 1} attentions step in at most softmax's {counts['softmax']} operations")
    return [{"attention": name, "decode_step": count} for name, count in counts.items()]


def main(argv: list[str] | None = None) -> None:
    """Print a Markdown table of operations per forward+backward, each row's goals met or missed."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    names = args.attentions or ["softmax", *rf_pairs()]
    if args.decode:
        write(decode_main(names, args), args.out)
        return
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
            totals = [
                operations(
                    training_step(
                        name,
                        n,
                        causal=causal,
                        batch=args.batch,
                        dim=args.dim,
                        heads=args.heads,
                        features=args.features,
                    )
                )
                for n in lengths
            ]
            growth = totals[-1] / totals[0]
            met = totals[-1] <= MAX_OPERATIONS and growth <= MAX_GROWTH
            misses += not met
            cells = " | ".join(f"{t:,}" for t in totals)
            print(f"| {label} | {cells} | {growth:.2f}x | {'met' if met else 'MISSED'} |", flush=True)
            rows.append({"attention": name, "causal": causal, "lengths": lengths, "operations": totals})
    write(rows, args.out)
    print(f"\n{len(rows) - misses} of {len(rows)} rows meet both goals")


def write(rows: list[dict], path: Path | None) -> None:
    """The rows as JSON at ``path`` (nothing for None)."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
