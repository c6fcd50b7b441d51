"""Speed, size and accuracy of RaLiMP, EUGen, SNNK and LowRank layers against the dense Linear + activation.

For each width ``d`` (MLP hidden width ``4 d``), a dense ``fc1`` (``d -> 4d``) + GELU (+ ``fc2``,
``4d -> d``) with PyTorch's default initialization is replaced by each method at the paper's budget of 32
random features (RaLiMP: K=2 with 8 polynomial features, one atom, 3 Gauss-Laguerre nodes with 4
projections each; EUGen and SNNK: 32 features; LowRank: rank 32). Every number is measured in the same run:

- forward time of the layer in training mode (``Psi`` recomputed) and eval mode (``Psi`` cached), as a
  ratio to the dense ``fc1`` + GELU;
- forward time of the layer compressed with ``fc2`` (``compress``), ratio to dense ``fc1`` + GELU + ``fc2``;
- trainable parameters of the layer (ratio to ``fc1``) and of the compressed pair (to ``fc1`` + ``fc2``);
- relative output MSE ``||y - gelu(fc1 x)||^2 / ||gelu(fc1 x)||^2`` at initialization, on standard-normal
  inputs (what a LayerNorm feeds an MLP), median over 3 seeds.

Run: ``uv run --frozen --all-packages python benchmarks/ralimp_layer.py`` (``--help`` for options).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
import torch.nn.functional as F
from torch import nn

import app_common as ac
import ralimp

METHODS = {
    "ralimp": (ralimp.RaLiMP, {"poly_features": 8, "num_freqs": 3, "freq_features": 4}),
    "eugen": (ralimp.EUGen, {"num_features": 32}),
    "snnk": (ralimp.SNNK, {"num_features": 32}),
    "lowrank": (ralimp.LowRank, {"rank": 32}),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[256, 768, 1280])
    parser.add_argument("--tokens", type=int, default=512, help="rows of the input batch")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per measurement (median)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds for the MSE")
    parser.add_argument("--device", default="auto")
    return parser.parse_args(argv)


def timed(fn, repeats: int, device: torch.device) -> float:
    """Median wall time of ``fn()`` in seconds, after two warm-up calls."""
    return ac.median_seconds(fn, repeats=repeats, warmup=2, device=device)


count = ac.count_parameters


def rows_for_width(d: int, args: argparse.Namespace, device: torch.device) -> list[list[str]]:
    """One table row per method at width ``d``."""
    torch.manual_seed(0)
    fc1, fc2 = nn.Linear(d, 4 * d).to(device), nn.Linear(4 * d, d).to(device)
    x = torch.randn(args.tokens, d, device=device)
    with torch.no_grad():
        target = F.gelu(fc1(x))

    def dense_times() -> tuple[float, float, float]:
        # re-timed next to every method: the ratios compare calls made seconds apart
        train = timed(lambda: F.gelu(fc1(x)), args.repeats, device)
        with torch.no_grad():
            return (
                train,
                timed(lambda: F.gelu(fc1(x)), args.repeats, device),
                timed(lambda: fc2(F.gelu(fc1(x))), args.repeats, device),
            )

    rows = []
    for name, (cls, kw) in METHODS.items():
        errors = []
        for seed in range(args.seeds):
            layer = cls.from_linear(fc1, "gelu", seed=seed, sample=x, **kw).eval()
            with torch.no_grad():
                y = layer(x)
            errors.append(float((y - target).pow(2).mean() / target.pow(2).mean()))
        dense_fc1, dense_eval, dense_pair = dense_times()
        layer.train()
        train = timed(lambda layer=layer: layer(x), args.repeats, device)
        layer.eval()
        with torch.no_grad():
            evaluation = timed(lambda layer=layer: layer(x), args.repeats, device)
            if hasattr(layer, "compress"):
                pair = layer.compress(fc2)
                compressed = timed(lambda pair=pair: pair(x), args.repeats, device)
                pair_params = count(pair)
            else:  # LowRank: the pair is down, up, fc2 (no folding possible through the activation)
                compressed = timed(lambda layer=layer: fc2(layer(x)), args.repeats, device)
                pair_params = count(layer) + count(fc2)
        budget = layer.num_random_features
        rows.append(
            [
                str(d),
                name,
                str(budget),
                f"{train / dense_fc1:.2f}",
                f"{evaluation / dense_eval:.2f}",
                f"{compressed / dense_pair:.2f}",
                f"{count(layer) / count(fc1):.3f}",
                f"{pair_params / (count(fc1) + count(fc2)):.3f}",
                f"{statistics.median(errors):.3g}",
            ]
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    """Print the Markdown table with the machine and the command."""
    args = parse_args(argv)
    device = ac.resolve_device(args.device)
    header = [
        "d",
        "method",
        "budget",
        "train fwd / dense",
        "eval fwd / dense",
        "compressed / dense pair",
        "params / fc1",
        "compressed params / fc1+fc2",
        "rel. MSE at init",
    ]
    rows = [row for d in args.widths for row in rows_for_width(d, args, device)]
    machine = ac.device_name(device)
    print(
        f"Machine: {machine}; torch {torch.__version__}; threads {torch.get_num_threads()}; "
        f"tokens {args.tokens}; float32"
    )
    print(f"Command: `{' '.join(['python', *sys.argv])}`\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
