r"""Rationally linearized MLP layers (RaLiMP) and the EUGen, SNNK and low-rank baselines.

$\sigma(W x + b) \approx \Psi(W) \Phi(x)$: the activation is replaced by a rational fit (polynomial plus
irreducible-quadratic atoms), the polynomial linearized by product features and each atom by its Laplace
representation at Gauss-Laguerre nodes with complex-exponential random features:

    import ralimp
    layer = ralimp.create("ralimp", linear, "gelu", budget=32, seed=0)  # num_random_features == 32
    y = layer(x)  # ~ gelu(linear(x))
    ralimp.replace_mlp(model, "ralimp", budget=32, last_k=4, inputs=batch, init="lstsq")
"""

from ralimp import analysis, calibration, fits, moments
from ralimp.activations import ACTIVATIONS, activation_name
from ralimp.base import CompressedLinearization, FeatureLinearization, LinearReplacement
from ralimp.baselines import SNNK, Dense, EUGen, LowRank
from ralimp.budget import BudgetError
from ralimp.discretized import DiscretizedFit, fit_discretized, layer_fit
from ralimp.features import complex_exponential_features, cos_sin_estimate, product_features
from ralimp.fits import FitOptions, Sizes
from ralimp.layer import RaLiMP
from ralimp.quadrature import atom_quadrature_error, gauss_laguerre, resolvable_argument
from ralimp.rational import RationalFunction, activation_fit, fit_rational
from ralimp.replace import (
    LAYERS,
    MAX_CALIBRATION_ROWS,
    MLPBlock,
    calibration_inputs,
    create,
    find_mlp_blocks,
    fit_summary,
    names,
    register,
    replace_mlp,
)

__all__ = [
    "ACTIVATIONS",
    "LAYERS",
    "MAX_CALIBRATION_ROWS",
    "SNNK",
    "BudgetError",
    "CompressedLinearization",
    "Dense",
    "DiscretizedFit",
    "EUGen",
    "FeatureLinearization",
    "FitOptions",
    "LinearReplacement",
    "LowRank",
    "MLPBlock",
    "RaLiMP",
    "RationalFunction",
    "Sizes",
    "activation_fit",
    "activation_name",
    "analysis",
    "atom_quadrature_error",
    "calibration",
    "calibration_inputs",
    "complex_exponential_features",
    "cos_sin_estimate",
    "create",
    "find_mlp_blocks",
    "fit_discretized",
    "fit_rational",
    "fit_summary",
    "fits",
    "gauss_laguerre",
    "layer_fit",
    "moments",
    "names",
    "product_features",
    "register",
    "replace_mlp",
    "resolvable_argument",
]
