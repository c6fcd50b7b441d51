"""``rf-features-demo``: the relative MSE of every (component function, weight matrix) pair.

On a fixed, seeded set of queries and keys ``~ N(0, scale^2 d^-1/2 I)`` (attention scales unit-variance
inputs by ``d^-1/4``; ``--scale`` shrinks them further, into the range where the estimators' heavy tails do
not swamp a mean over a few seeds), each pair's
estimate ``phi_q @ phi_k.mT`` is compared with the exact kernel (softmax by default):
``mean((K_hat - K)^2) / mean(K^2)``, averaged over independently seeded weight matrices.

With ``--norms r1 r2 ...`` it prints instead, per pair, the relative Frobenius error
``||K_hat - K||_F / ||K||_F`` (median over seeds) for queries and keys of norm exactly ``r`` in random
directions, at ``s`` = the first ``--features`` value, in float64 (``exp(q.k)`` reaches ``e^100`` at norm 10).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

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
    parser.add_argument(
        "--norms",
        type=float,
        nargs="+",
        default=None,
        help="tabulate the error against ||q|| = ||k|| instead",
    )
    return parser.parse_args(argv)


def pair_errors(
    component: str,
    matrix: str,
    s: int,
    q: torch.Tensor,
    k: torch.Tensor,
    args: argparse.Namespace,
    **options: Any,
) -> list[float]:
    """``relative_mse`` of the pair's estimate on ``q, k``, one per seed."""
    errors = []
    for seed in range(args.seeds):
        fm = create(
            component,
            weight_matrix=matrix,
            num_features=s,
            dim=args.dim,
            seed=seed,
            kernel=args.kernel,
            **options,
        )
        errors.append(relative_mse(fm.to(q.device), q, k))
    return errors


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
            cells = [
                f"{statistics.mean(pair_errors(component, matrix, s, q, k, args)):.2e}" for s in args.features
            ]
            rows.append([component, matrix, *cells])
    return header, rows


def norm_table(args: argparse.Namespace) -> tuple[list[str], list[list[str]]]:
    """Header and rows: one row per pair, one column per norm ``||q|| = ||k||``."""
    device = resolve_device(args.device)
    data = torch.Generator().manual_seed(0)
    directions = torch.randn(2, args.points, args.dim, generator=data, dtype=torch.float64)
    directions = (directions / directions.norm(dim=-1, keepdim=True)).to(device)
    header = ["component", "matrix", *[f"norm {r:g}" for r in args.norms]]
    rows = []
    for component in args.components or names():
        for matrix in args.matrices or rf_matrices.names():
            cells = []
            for r in args.norms:
                q, k = directions * r
                errors = pair_errors(
                    component, matrix, args.features[0], q, k, args, matrix_options={"dtype": torch.float64}
                )
                cells.append(f"{statistics.median(errors) ** 0.5:.2e}")
            rows.append([component, matrix, *cells])
    return header, rows


def main(argv: list[str] | None = None) -> None:
    """Print the table."""
    args = parse_args(argv)
    start = time.perf_counter()
    if args.norms:
        header, rows = norm_table(args)
        title = (
            f"Relative error ||K_hat - K||_F / ||K||_F of the {args.kernel}-kernel estimate against "
            f"||q|| = ||k|| (d={args.dim}, {args.points} queries and keys in random directions, "
            f"s={args.features[0]}, float64, median of {args.seeds} seeds)"
        )
    else:
        header, rows = error_table(args)
        title = (
            f"Relative MSE of the {args.kernel}-kernel estimate (d={args.dim}, {args.points} queries and "
            f"keys ~ N(0, I) {args.scale:g} d^-1/4, mean of {args.seeds} seeds)"
        )
    print_report(title, header, rows, start)


if __name__ == "__main__":
    main()
