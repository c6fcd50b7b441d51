"""Weight matrices W (s x d) for random features: how the frequencies are chosen or learned.

Section 3.1 of Spectraformer: Monte Carlo (``base``, ``orf``), structured (``sorf``, ``fastfood``),
unit-cube (``qmc``, ``mm``), quadrature (``sgq``) and learned (``fastfoodl``) weight matrices, all behind
one registry (``learnable=True``: any of them as a trainable dense ``W``, ``num_heads=H``: one per head):

    import rf_matrices
    w = rf_matrices.create("orf", num_features=128, dim=32, seed=0)
    y = w(x)  # x @ W.T, (..., 128)
"""

from rf_matrices.drawn import DrawnMatrix
from rf_matrices.hadamard import fwht, hadamard_matrix, next_power_of_two
from rf_matrices.kernels import gaussian_kernel, relative_kernel_error, trig_kernel_estimate
from rf_matrices.monte_carlo import ORF, Base
from rf_matrices.quadrature import SGQ, gauss_hermite, smolyak_gauss_hermite
from rf_matrices.registry import WEIGHT_MATRICES, create, names, register
from rf_matrices.report import print_report
from rf_matrices.structured import SORF, BlockTransform, FastFood, FastFoodL
from rf_matrices.unit_cube import MM, QMC
from rf_matrices.weight_matrix import DenseWeightMatrix, WeightMatrix

__all__ = [
    "MM",
    "ORF",
    "QMC",
    "SGQ",
    "SORF",
    "WEIGHT_MATRICES",
    "Base",
    "BlockTransform",
    "DenseWeightMatrix",
    "DrawnMatrix",
    "FastFood",
    "FastFoodL",
    "WeightMatrix",
    "create",
    "fwht",
    "gauss_hermite",
    "gaussian_kernel",
    "hadamard_matrix",
    "names",
    "next_power_of_two",
    "print_report",
    "register",
    "relative_kernel_error",
    "smolyak_gauss_hermite",
    "trig_kernel_estimate",
]
