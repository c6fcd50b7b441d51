"""``rf-features-demo``: the relative MSE of every (component function, weight matrix) pair.

On a fixed, seeded set of queries and keys ``~ N(0, scale^2 d^-1/2 I)`` (attention scales unit-variance
inputs by ``d^-1/4``; ``--scale`` shrinks them further, into the range where the estimators' heavy tails do
not swamp a mean over a few seeds), each pair's
estimate ``phi_q @ phi_k.mT`` is compared with the exact kernel (softmax by default):
``mean((K_hat - K)^2) / mean(K^2)``, averaged over independently seeded weight matrices.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import rf_matrices
from rf_features.kernels import relative_mse
from rf_features.registry import create, names
from rf_matrices import print_report
from spectraformer_core import resolve_device


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--help`` lists them)."""
    parser = argparse.ArgumentParser(prog="rf-features-demo", description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=32, help="query/key dimension d (LRA heads: 32)")
    parser.add_argument("--points", type=int, default=128, help="number of queries and of keys")
    parser.add_argument("--scale", type=float, default=0.5, help="input scale relative to d^-1/4")
    parser.add_argument("--features", type=int, nargs="+", default=[64, 128, 256], help="rows s of W")
    parser.add_argument("--seeds", type=int, default=100, help="weight matrices drawn per cell")
    parser.add_argument("--components", nargs="+", default=None, help="component names (default: all)")
    parser.add_argument("--matrices", nargs="+", default=None, help="weight matrix names (default: all)")
    parser.add_argument("--kernel", default="softmax", choices=["softmax", "gaussian"])
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    return parser.parse_args(argv)


def error_table(args: argparse.Namespace) -> tuple[list[str], list[list[str]]]:
    """Header and rows: one row per (component, matrix) pair, one column per feature count."""
    device = resolve_device(args.device)
    data = torch.Generator().manual_seed(0)
    scale = args.scale * args.dim**-0.25
    q = torch.randn(args.points, args.dim, generator=data) * scale
    k = torch.randn(args.points, args.dim, generator=data) * scale
    q, k = q.to(device), k.to(device)
    header = ["component", "matrix", *[f"s={s}" for s in args.features]]
    rows = []
    for component in args.components or names():
        for matrix in args.matrices or rf_matrices.names():
            cells = []
            for s in args.features:
                errors = []
                for seed in range(args.seeds):
                    fm = create(
                        component,
                        weight_matrix=matrix,
                        num_features=s,
                        dim=args.dim,
                        seed=seed,
                        kernel=args.kernel,
                    ).to(device)
                    errors.append(relative_mse(fm, q, k))
                cells.append(f"{statistics.mean(errors):.2e}")
            rows.append([component, matrix, *cells])
    return header, rows


def main(argv: list[str] | None = None) -> None:
    """Print the table."""
    args = parse_args(argv)
    start = time.perf_counter()
    header, rows = error_table(args)
    print_report(
        f"Relative MSE of the {args.kernel}-kernel estimate (d={args.dim}, {args.points} queries and keys "
        f"~ N(0, I) {args.scale:g} d^-1/4, mean of {args.seeds} seeds)",
        header,
        rows,
        start,
    )


if __name__ == "__main__":
    main()
