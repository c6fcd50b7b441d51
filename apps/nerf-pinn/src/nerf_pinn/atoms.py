r"""What an atom costs and buys in a linearized layer: bias$^2$ against estimator variance (Props. 1-2).

For a layer $f(W x + b)$ and a sample of its inputs, `atom_tradeoff` fits RaLiMP's activation with $J = 0$
and $J = 1$ atoms at the same feature budget, in each fit mode (``variance``, ``discretized``, ``paper``),
and splits each fit's expected squared error on the calibration pairs (`ralimp.fits.expected_squared_error`)
into the squared bias of the expectation and the exact variance of the random-feature readout. The
variance-aware fit (RaLiMP's default) keeps the $J$ of the least total; the other two modes fit the bias
alone. `main` prints the table for the hidden layers the PINN of ``configs/pinn-paper.toml`` linearizes::

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


def pinn_tradeoffs(config: PinnConfig) -> dict[int, list[dict[str, Any]]]:
    """`atom_tradeoff` for every layer the PINN of ``config`` linearizes, at its initialization."""
    from nerf_pinn.pinn import PINN, PinnFamily

    family = PinnFamily(config)
    model = family.build("dense")
    assert isinstance(model, PINN)
    sample = model.normalize(family.t_f[:1024], family.x_f[:1024])
    inputs = stack_inputs(model.layers, sample)
    return {
        i: atom_tradeoff(
            cast(FeedForward, model.layers[i]),
            inputs[i],
            budget=config.features,
            num_freqs=config.num_freqs,
            balance=config.balance_value(),
        )
        for i in replaced_layers(config.replace, config.depth)
    }


def main() -> None:
    """Print the table of `pinn_tradeoffs` for ``configs/pinn-paper.toml`` (seed 0)."""
    import app_common as ac

    settings = tomllib.loads(PAPER_CONFIG.read_text())
    config = PinnConfig(**{k: v for k, v in settings.items() if k != "out"}, threads=1)
    header = ["layer", "atoms", "fit", "bias^2", "variance", "bias^2 + variance", "mean f(t)^2"]
    rows = [
        [str(i), str(r["atoms"]), r["fit"], *(f"{r[k]:.2e}" for k in NUMBERS)]
        for i, table in pinn_tradeoffs(config).items()
        for r in table
    ]
    print(ac.markdown_table(header, rows))
