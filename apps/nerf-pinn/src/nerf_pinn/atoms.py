r"""What an atom costs and buys in each family's linearized layers, and each replacement's spread at them.

`main` builds a family's RaLiMP model as its run does (seed 0, the family's defaults, or a TOML file's
settings) and prints `ralimp.analysis.atoms_table` for its linearized layers: the squared bias one atom
removes, the estimator variance it adds at the budget, and the atoms the variance-aware fit keeps. For the
PINN it also prints each kind's relative error at the layers' inputs (`ralimp.analysis.relative_spread`)::

    uv run --frozen --package nerf-pinn python -m nerf_pinn.atoms pinn   # siren, nerf; --config FILE.toml
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import cast

import torch

import ralimp
from nerf_pinn.config import FAMILIES, PinnConfig, replaced_layers
from nerf_pinn.experiment import Family
from nerf_pinn.families import family_class
from nerf_pinn.layers import FeedForward, stack_inputs
from nerf_pinn.pinn import PINN, PinnFamily
from spectraformer_core import markdown_table


def family(name: str, config: Path | None = None) -> Family:
    """The family ``name`` at its defaults or at the settings of the TOML file ``config``, on one thread."""
    settings = {} if config is None else tomllib.loads(config.read_text())
    return family_class(name)(FAMILIES[name](**{k: v for k, v in settings.items() if k != "out"}, threads=1))


def pinn_layers(config: PinnConfig) -> list[tuple[int, FeedForward, torch.Tensor]]:
    """``(index, layer, its inputs)`` of every layer the PINN of ``config`` linearizes, at initialization."""
    pinn = PinnFamily(config)
    model = cast(PINN, pinn.build("dense"))
    inputs = stack_inputs(model.layers, pinn.calibration_sample(model))
    indices = replaced_layers(config.replace, config.depth)
    return [(i, cast(FeedForward, model.layers[i]), inputs[i]) for i in indices]


def main(argv: list[str] | None = None) -> None:
    """Print the atoms table of a family's RaLiMP model (and, for the PINN, each kind's spread)."""
    parser = argparse.ArgumentParser(prog="python -m nerf_pinn.atoms", description=__doc__.splitlines()[0])
    parser.add_argument("family", choices=tuple(FAMILIES))
    parser.add_argument("--config", type=Path, default=None, help="TOML settings (default: the quick run's)")
    args = parser.parse_args(argv)
    chosen = family(args.family, args.config)
    print(ralimp.analysis.atoms_table(ralimp.analysis.ralimp_layers(chosen.build("ralimp"))))
    if not isinstance(chosen, PinnFamily):
        return
    config = chosen.config
    budget, balance = config.features, config.balance_value()
    kinds = {"ralimp": {"num_freqs": config.num_freqs, "balance": balance}, "eugen": {}}
    kinds["snnk"] = {"balance": balance}
    spread = []
    for i, layer, x in pinn_layers(cast(PinnConfig, config)):
        linear, act = layer.scaled_linear(), layer.activation_name
        errors = [
            ralimp.analysis.relative_spread(linear, act, x, k, budget=budget, **o) for k, o in kinds.items()
        ]
        spread.append([str(i), *(f"{e:.3g}" for e in errors)])
    print()
    print(markdown_table(["layer", *(f"{k}: relative RMS error" for k in kinds)], spread))


if __name__ == "__main__":
    main()
