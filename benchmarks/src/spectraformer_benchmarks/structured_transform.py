"""Fast Walsh-Hadamard transform against the dense product, for SORF and FastFood.

Times ``w(x)`` for ``x`` of ``2^22 / d`` rows (16 MiB of float32) with ``fast_transform=True`` and
``False``, for ``s = d``: the measurements behind ``BlockTransform.DENSE_MAX_DIM``, the automatic choice.

    uv run --frozen nox -s bench
    python -m spectraformer_benchmarks.structured_transform --dims 32 1024 4096
"""

from __future__ import annotations

import argparse

import torch

import rf_matrices
from app_common.measure import median_seconds
from spectraformer_core import markdown_table


def median_ms(fn, repeats: int) -> float:
    """Median wall time of ``fn()`` in milliseconds, after one warm-up call."""
    return 1000 * median_seconds(fn, repeats=repeats, warmup=1)


def main(argv: list[str] | None = None) -> None:
    """Print the table of transform and dense times per matrix and dimension."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[32, 128, 512, 1024, 2048, 4096])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    rows = []
    for name in ("sorf", "fastfood"):
        for d in args.dims:
            x = torch.randn(2**22 // d, d)
            fast_matrix = rf_matrices.create(name, d, d, seed=0, fast_transform=True)
            dense_matrix = rf_matrices.create(name, d, d, seed=0, fast_transform=False)
            with torch.no_grad():
                fast = median_ms(lambda m=fast_matrix, x=x: m(x), args.repeats)
                dense = median_ms(lambda m=dense_matrix, x=x: m(x), args.repeats)
            chosen = "transform" if rf_matrices.create(name, d, d).fast_transform else "dense"
            rows.append([name, str(d), f"{fast:.1f}", f"{dense:.1f}", f"{dense / fast:.2f}", chosen])
    header = ["matrix", "d = s", "transform ms", "dense ms", "dense / transform", "automatic choice"]
    print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads\n")
    print(markdown_table(header, rows))


if __name__ == "__main__":
    main()
