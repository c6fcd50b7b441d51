r"""What an atom costs and buys in a linearized layer: bias$^2$ against estimator variance (Props. 1-2).

For a layer $f(W x + b)$ and a sample of its inputs, `atom_tradeoff` fits RaLiMP's activation with $J = 0$
and $J = 1$ atoms at the same feature budget, in each fit mode (``variance``, ``discretized``, ``paper``),
and splits each fit's expected squared error on the calibration pairs (`ralimp.fits.expected_squared_error`)
into the squared bias of the expectation and the exact variance of the random-feature readout. The
variance-aware fit (RaLiMP's default) keeps the $J$ of the least total; the other two modes fit the bias
alone. `relative_spread` measures any replacement's relative error at the layer's inputs by Monte Carlo.
`main` prints both for the hidden layers the PINN of ``configs/pinn-paper.toml`` linearizes::

    uv run --frozen --package nerf-pinn python -c "from nerf_pinn.atoms import main; main()"
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any, cast

import torch

import ralimp
from nerf_pinn.config import PinnConfig, replaced_layers
from nerf_pinn.layers import FeedForward, stack_inputs
from nerf_pinn.pinn import PINN, PinnFamily
from spectraformer_core import markdown_table

#: The numbers of a row of `atom_tradeoff`, in the table's order.
NUMBERS = ("bias2", "variance", "total", "signal")

#: The fit modes compared: RaLiMP's default and the two that fit the bias only.
MODES = ("variance", "discretized", "paper")

PAPER_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "pinn-paper.toml"


def atom_tradeoff(
    layer: FeedForward,
    sample: torch.Tensor,
    *,
    budget: int,
    num_freqs: int = 1,
    balance: float | str = "auto",
) -> list[dict[str, Any]]:
    r"""Bias$^2$ and variance of RaLiMP's fits of ``layer`` with 0 and 1 atom, one row per (atoms, mode).

    Args:
        layer: the dense layer ``activation(scale (W x + b))``.
        sample: its inputs ``(n, in_features)`` (the calibration sample).
        budget: random features of the layer (``ralimp.create``'s budget).
        num_freqs: Gauss-Laguerre nodes per atom.
        balance: RaLiMP's ``balance``.

    Returns:
        Rows ``{"atoms", "fit", "bias2", "variance", "total", "signal"}``: mean squared bias of the layer's
        expectation, mean variance of its output over the projections, their sum, and the mean of
        $f(t)^2$ on the calibration pairs, for scale.
    """
    linear = layer.scaled_linear()
    rows = []
    for atoms in (0, 1):
        built = ralimp.create(
            "ralimp",
            linear,
            layer.activation_name,
            budget=budget,
            sample=sample,
            num_atoms=atoms,
            num_freqs=num_freqs,
            balance=balance,
            fit="discretized",
        )
        assert isinstance(built, ralimp.RaLiMP)
        cal, sizes, fn = built.calibration, built.sizes(), built.target
        signal = float(fn(cal.t).double().pow(2).mean())
        for mode in MODES[: 3 if atoms else 2]:  # without atoms "paper" is the least-squares polynomial
            options = dataclasses.replace(built.options, fit=mode)
            fit = ralimp.fits.FITS.get(mode)(fn, cal, sizes, options)
            bias2 = float((fit(cal.t) - fn(cal.t).double()).pow(2).mean())
            total = ralimp.fits.expected_squared_error(fit, fn, cal, sizes)
            rows.append(
                {"atoms": atoms, "fit": mode, "bias2": bias2, "variance": total - bias2, "total": total}
                | {"signal": signal}
            )
    return rows


def relative_spread(
    layer: FeedForward,
    sample: torch.Tensor,
    kind: str,
    *,
    budget: int | None,
    seeds: int = 16,
    **options: Any,
) -> float:
    r"""$\sqrt{\operatorname{mean} (\hat y - y)^2 / \operatorname{mean} y^2}$: a ``kind`` layer at ``sample``.

    $y$ is ``layer``'s output, $\hat y$ the replacement's (``ralimp.create(kind, ..., seed=s)``) at
    initialization, the mean over the sample, the outputs and ``seeds`` draws of the projections: the
    estimator's relative root-mean-square error (bias and variance together), by Monte Carlo.
    """
    linear = layer.scaled_linear()
    with torch.no_grad():
        target = layer(sample)
        errors = [
            (
                ralimp.create(
                    kind, linear, layer.activation_name, budget=budget, sample=sample, seed=s, **options
                )(sample)
                - target
            )
            .pow(2)
            .mean()
            for s in range(seeds)
        ]
    return float((torch.stack(errors).mean() / target.pow(2).mean()).sqrt())


def pinn_layers(config: PinnConfig) -> list[tuple[int, FeedForward, torch.Tensor]]:
    """``(index, layer, its inputs)`` of every layer the PINN of ``config`` linearizes, at initialization."""
    family = PinnFamily(config)
    model = cast(PINN, family.build("dense"))
    inputs = stack_inputs(model.layers, model.normalize(family.t_f[:1024], family.x_f[:1024]))
    indices = replaced_layers(config.replace, config.depth)
    return [(i, cast(FeedForward, model.layers[i]), inputs[i]) for i in indices]


def main() -> None:
    """Print `atom_tradeoff` and every kind's `relative_spread` for ``configs/pinn-paper.toml`` (seed 0)."""
    settings = tomllib.loads(PAPER_CONFIG.read_text())
    config = PinnConfig(**{k: v for k, v in settings.items() if k != "out"}, threads=1)
    layers = pinn_layers(config)
    balance, budget = config.balance_value(), config.features
    header = ["layer", "atoms", "fit", "bias^2", "variance", "bias^2 + variance", "mean f(t)^2"]
    rows = [
        [str(i), str(r["atoms"]), r["fit"], *(f"{r[k]:.2e}" for k in NUMBERS)]
        for i, layer, x in layers
        for r in atom_tradeoff(layer, x, budget=budget, num_freqs=config.num_freqs, balance=balance)
    ]
    print(markdown_table(header, rows))
    kinds: dict[str, dict[str, Any]] = {
        "ralimp": {"num_freqs": config.num_freqs, "balance": balance},
        "eugen": {},
        "snnk": {"balance": balance},
    }
    spread = [
        [str(i), *(f"{relative_spread(layer, x, k, budget=budget, **o):.3g}" for k, o in kinds.items())]
        for i, layer, x in layers
    ]
    print()
    print(markdown_table(["layer", *(f"{k}: relative RMS error" for k in kinds)], spread))
