"""``ralimp-fit`` (or ``python -m ralimp.fit_activations``): recompute the shipped activation fits.

For every shipped activation on ``[-4, 4]``, ``K = 1..3`` and ``J = 0..3``: the continuous rational fit
(`ralimp.fit_rational`) and, for ``num_freqs = 1..4``, the fit in the layer's discretized basis
(`ralimp.fit_discretized`, started from the continuous one). Writes ``fits.json`` (by default the
package's own copy) and prints a Markdown table with three errors per fit: the continuous fit, the
continuous fit discretized node by node at the Gauss-Laguerre weights (what the layer computed before), and
the discretized fit (what the layer computes in expectation now). ``--plot PATH`` draws the ``K = 2``,
``num_freqs = 3`` fits and their errors (needs matplotlib: the ``plot`` extra).
"""

from __future__ import annotations

import argparse
import json
import time
from importlib import resources
from pathlib import Path

import torch

from ralimp.activations import ACTIVATIONS
from ralimp.discretized import DiscretizedFit, fit_discretized, nodewise_quadrature
from ralimp.rational import DEFAULT_INTERVAL, RationalFunction, fit_rational, shipped_fit_key

SHIPPED = ("gelu", "gelu_tanh", "silu", "tanh", "sigmoid", "softsign", "relu")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--help`` lists them)."""
    parser = argparse.ArgumentParser(prog="ralimp-fit", description=__doc__.splitlines()[0])
    parser.add_argument("--activations", nargs="+", default=list(SHIPPED), help="registered names")
    parser.add_argument("--degrees", type=int, nargs="+", default=[1, 2, 3], help="polynomial degrees K")
    parser.add_argument("--atoms", type=int, nargs="+", default=[0, 1, 2, 3], help="atom counts J")
    parser.add_argument("--freqs", type=int, nargs="+", default=[1, 2, 3, 4], help="Gauss-Laguerre nodes")
    parser.add_argument("--starts", type=int, default=4, help="Levenberg-Marquardt starts, continuous fits")
    parser.add_argument("--node-starts", type=int, default=3, help="starts of the discretized fits")
    parser.add_argument("--node-points", type=int, default=1001, help="grid of the discretized fits")
    parser.add_argument("--output", type=Path, default=None, help="JSON path (default: the package's)")
    parser.add_argument("--plot", type=Path, default=None, help="PNG of the K=2, 3-node fits and errors")
    return parser.parse_args(argv)


def compute_fits(args: argparse.Namespace) -> tuple[dict[str, RationalFunction], dict[str, DiscretizedFit]]:
    """Every requested continuous fit (keyed ``gelu/K2/J1``) and discretized fit (``gelu/K2/J1/N3``)."""
    continuous, discretized = {}, {}
    for name in args.activations:
        fn = ACTIVATIONS.get(name)
        for degree in args.degrees:
            for atoms in args.atoms:
                key = shipped_fit_key(name, degree, atoms)
                fit = fit_rational(
                    fn, DEFAULT_INTERVAL, num_atoms=atoms, poly_degree=degree, num_starts=args.starts
                )
                continuous[key] = fit
                for freqs in args.freqs if atoms else []:
                    discretized[f"{key}/N{freqs}"] = fit_discretized(
                        fn,
                        DEFAULT_INTERVAL,
                        poly_degree=degree,
                        num_atoms=atoms,
                        num_freqs=freqs,
                        continuous=fit,
                        num_points=args.node_points,
                        num_starts=args.node_starts,
                    )
    return continuous, discretized


def node_energy(fit: DiscretizedFit) -> float:
    r"""$\sum_{jk} ((w^c_{jk})^2 + (w^s_{jk})^2)$, the factor of the rational block's variance (App. A.3)."""
    w_c, w_s = fit.coefficients()
    return float((w_c**2 + w_s**2).sum())


def markdown(discretized: dict[str, DiscretizedFit]) -> str:
    """One row per discretized fit: the three errors, the node energy and the widths."""
    lines = [
        "| fit | continuous max err | node-wise quadrature max err | discretized fit max err "
        "| sum w^2 | widths q |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for key, fit in discretized.items():
        fn = ACTIVATIONS.get(key.split("/")[0])
        assert fit.continuous is not None  # every fit of this script is discretized from a continuous one
        old = nodewise_quadrature(fit.continuous, fit.num_freqs).errors(fn)[0]
        widths = ", ".join(f"{q:.3g}" for *_, q in fit.atoms)
        lines.append(
            f"| {key} | {fit.continuous.max_error:.2e} | {old:.2e} | {fit.max_error:.2e} "
            f"| {node_energy(fit):.3g} | {widths} |"
        )
    return "\n".join(lines)


def plot(discretized: dict[str, DiscretizedFit], names: list[str], path: Path) -> None:
    """Each activation with its ``K = 2``, 3-node fits (top) and their absolute errors (bottom, log scale).

    Solid: the discretized fit (the layer's expectation); dashed: the continuous fit discretized node-wise.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(names), figsize=(3.2 * len(names), 5.6), squeeze=False)
    t = torch.linspace(*DEFAULT_INTERVAL, 2001, dtype=torch.float64)
    for col, name in enumerate(names):
        fn = ACTIVATIONS.get(name)
        axes[0, col].plot(t, fn(t), color="black", lw=2.5, label=name)
        for atoms in (1, 2, 3):
            fit = discretized.get(f"{name}/K2/J{atoms}/N3")
            if fit is None:
                continue
            assert fit.continuous is not None  # as in the table above
            line = axes[0, col].plot(t, fit(t), lw=1, ls="--", label=f"J={atoms} (max {fit.max_error:.1e})")
            color = line[0].get_color()
            axes[1, col].semilogy(t, (fit(t) - fn(t)).abs().clamp_min(1e-16), lw=1, color=color)
            old = nodewise_quadrature(fit.continuous, 3)
            axes[1, col].semilogy(t, (old(t) - fn(t)).abs().clamp_min(1e-16), lw=1, ls=":", color=color)
        axes[0, col].set_title(f"{name}, K=2, 3 nodes")
        axes[0, col].legend(fontsize=7)
        axes[1, col].set_xlabel("t")
        axes[1, col].set_ylim(1e-8, 1)
    axes[1, 0].set_ylabel("|E y(t) - f(t)|  (dotted: node-wise)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``ralimp-fit``."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    continuous, discretized = compute_fits(args)
    output = args.output or Path(str(resources.files("ralimp").joinpath("fits.json")))
    payload = {
        "about": "Rational fits of activations on [-4, 4] (fits) and fits in the RaLiMP layer's discretized "
        "basis (discretized, keyed .../N<num_freqs>); recompute with `ralimp-fit`.",
        "fits": {key: fit.to_dict() for key, fit in continuous.items()},
        "discretized": {key: {**fit.to_dict(), "continuous": None} for key, fit in discretized.items()},
    }
    output.write_text(json.dumps(payload, indent=1) + "\n")
    print(markdown(discretized))
    elapsed = time.perf_counter() - start
    print(f"\nwrote {len(continuous)} + {len(discretized)} fits to {output} in {elapsed:.0f} s")
    if args.plot is not None:
        plot(discretized, args.activations, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
