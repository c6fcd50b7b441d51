"""``ralimp-fit`` (or ``python -m ralimp.fit_activations``): recompute the shipped activation fits.

Fits gelu, silu, tanh, sigmoid, softsign and relu on ``[-4, 4]`` with
[`ralimp.fit_rational`][ralimp.fit_rational] for every ``K = 1..3`` and ``J = 0..3``, writes ``fits.json`` (by
default the package's own copy) and prints a Markdown table of the errors. ``--plot PATH`` also draws each
activation's ``K = 2`` fits and their errors (needs matplotlib: the ``plot`` extra).
"""

from __future__ import annotations

import argparse
import json
import time
from importlib import resources
from pathlib import Path

import torch

from ralimp.activations import ACTIVATIONS
from ralimp.rational import DEFAULT_INTERVAL, RationalFunction, fit_rational, shipped_fit_key

SHIPPED = ("gelu", "silu", "tanh", "sigmoid", "softsign", "relu")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--help`` lists them)."""
    parser = argparse.ArgumentParser(prog="ralimp-fit", description=__doc__.splitlines()[0])
    parser.add_argument("--activations", nargs="+", default=list(SHIPPED), help="registered names")
    parser.add_argument("--degrees", type=int, nargs="+", default=[1, 2, 3], help="polynomial degrees K")
    parser.add_argument("--atoms", type=int, nargs="+", default=[0, 1, 2, 3], help="atom counts J")
    parser.add_argument("--starts", type=int, default=8, help="Levenberg-Marquardt starts per fit")
    parser.add_argument("--output", type=Path, default=None, help="JSON path (default: the package's)")
    parser.add_argument("--plot", type=Path, default=None, help="PNG of the K=2 fits and their errors")
    return parser.parse_args(argv)


def compute_fits(args: argparse.Namespace) -> dict[str, RationalFunction]:
    """Every requested fit, keyed as in ``fits.json``."""
    fits = {}
    for name in args.activations:
        for degree in args.degrees:
            for atoms in args.atoms:
                fits[shipped_fit_key(name, degree, atoms)] = fit_rational(
                    ACTIVATIONS.get(name),
                    DEFAULT_INTERVAL,
                    num_atoms=atoms,
                    poly_degree=degree,
                    num_starts=args.starts,
                )
    return fits


def markdown(fits: dict[str, RationalFunction]) -> str:
    """Table: one row per fit with its errors and pole widths."""
    lines = ["| fit | max error | RMS error | widths q |", "| --- | --- | --- | --- |"]
    for key, fit in fits.items():
        widths = ", ".join(f"{q:.3g}" for *_, q in fit.atoms) or "-"
        lines.append(f"| {key} | {fit.max_error:.2e} | {fit.rms_error:.2e} | {widths} |")
    return "\n".join(lines)


def plot(fits: dict[str, RationalFunction], names: list[str], path: Path) -> None:
    """Each activation with its ``K = 2`` fits (top) and their absolute errors on a log scale (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(names), figsize=(3.2 * len(names), 5.6), squeeze=False)
    t = torch.linspace(*DEFAULT_INTERVAL, 2001, dtype=torch.float64)
    for col, name in enumerate(names):
        fn = ACTIVATIONS.get(name)
        axes[0, col].plot(t, fn(t), color="black", lw=2.5, label=name)
        for key, fit in fits.items():
            if key.startswith(f"{name}/K2/") and fit.num_atoms > 0:
                label = f"J={fit.num_atoms} (max {fit.max_error:.1e})"
                axes[0, col].plot(t, fit(t), lw=1, ls="--", label=label)
                axes[1, col].semilogy(
                    t, (fit(t) - fn(t)).abs().clamp_min(1e-16), lw=1, label=f"J={fit.num_atoms}"
                )
        axes[0, col].set_title(f"{name}, K=2")
        axes[0, col].legend(fontsize=7)
        axes[1, col].set_xlabel("t")
        axes[1, col].set_ylim(1e-12, 1)
    axes[1, 0].set_ylabel("|R(t) - f(t)|")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``ralimp-fit``."""
    args = parse_args(argv)
    start = time.perf_counter()
    fits = compute_fits(args)
    output = args.output or Path(str(resources.files("ralimp").joinpath("fits.json")))
    payload = {
        "about": "Rational fits of activations on [-4, 4]; recompute with `ralimp-fit`.",
        "fits": {key: fit.to_dict() for key, fit in fits.items()},
    }
    output.write_text(json.dumps(payload, indent=1) + "\n")
    print(markdown(fits))
    print(f"\nwrote {len(fits)} fits to {output} in {time.perf_counter() - start:.0f} s")
    if args.plot is not None:
        plot(fits, args.activations, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
