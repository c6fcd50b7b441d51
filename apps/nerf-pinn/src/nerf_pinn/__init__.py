"""Coordinate networks with linearized MLPs: PINN (Burgers), SIREN, NeRF.

Each family compares the dense MLP with RaLiMP, SNNK and EUGen layers made by ``ralimp.create`` at one
feature budget; ``nerf-pinn train --family pinn|siren|nerf`` (or the shortcuts ``nerf-pinn pinn``, ...)
runs it from the command line:

    from nerf_pinn import PinnConfig, PinnFamily, compare
    records = compare(PinnFamily(PinnConfig(steps=200, device="cpu")))
"""

from nerf_pinn.config import FAMILIES, CompareConfig, NerfConfig, PinnConfig, SirenConfig, replaced_layers
from nerf_pinn.experiment import Family, compare, results_table, train_variant
from nerf_pinn.layers import (
    DENSE,
    KINDS,
    FeedForward,
    inference_parameters,
    linearize_mlp_layers,
    stack_inputs,
)
from nerf_pinn.nerf import NerfFamily
from nerf_pinn.pinn import PINN, PinnFamily
from nerf_pinn.siren import SirenFamily

__all__ = [
    "DENSE",
    "FAMILIES",
    "KINDS",
    "PINN",
    "CompareConfig",
    "Family",
    "FeedForward",
    "NerfConfig",
    "NerfFamily",
    "PinnConfig",
    "PinnFamily",
    "SirenConfig",
    "SirenFamily",
    "compare",
    "inference_parameters",
    "linearize_mlp_layers",
    "replaced_layers",
    "results_table",
    "stack_inputs",
    "train_variant",
]
