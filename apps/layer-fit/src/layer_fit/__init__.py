"""``layer-fit``: the synthetic single-layer fit of the RaLiMP paper (Fig. 2).

Low-rank, EUGen, SNNK and RaLiMP layers (from ``ralimp``) at a shared feature budget are trained to fit
``Y = f(X W^T)`` (X, W i.i.d. Unif[0, 1], X and Y standardized per column); the figure is the train MSE:

    from layer_fit import FitConfig, run_fit, report
    results = run_fit(FitConfig(activation=("gelu",), seed=(0, 1), steps=300))
"""

from layer_fit import floors
from layer_fit.config import ACTIVATIONS, PAPER_METHODS, SWEEP_BUDGETS, FitConfig, QuickConfig, ReportConfig
from layer_fit.data import CENTERINGS, LayerData, make_data, standardize
from layer_fit.floors import eckart_young_floor, information_floor
from layer_fit.methods import METHODS, RALIMP_SHAPE, FitModel, build
from layer_fit.report import aggregate, report
from layer_fit.train import fit_one, planned_runs, run_fit

__all__ = [
    "ACTIVATIONS",
    "CENTERINGS",
    "METHODS",
    "PAPER_METHODS",
    "RALIMP_SHAPE",
    "SWEEP_BUDGETS",
    "FitConfig",
    "FitModel",
    "LayerData",
    "QuickConfig",
    "ReportConfig",
    "aggregate",
    "build",
    "eckart_young_floor",
    "fit_one",
    "floors",
    "information_floor",
    "make_data",
    "planned_runs",
    "report",
    "run_fit",
    "standardize",
]
