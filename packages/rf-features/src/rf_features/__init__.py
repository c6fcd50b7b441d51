"""Component functions and random feature maps for the softmax kernel (Spectraformer Section 3.2).

Any component function (``trigrf``, ``posrf``, ``posrf-hyp``, ``gerf``, ``oprf``, ``saderf``) combines with
any ``rf_matrices`` weight matrix:

    import rf_features
    fm = rf_features.create("oprf", weight_matrix="sgq", num_features=128, dim=32)
    phi_q, phi_k = fm(q, k)   # phi_q @ phi_k.mT ~ exp(q @ k.mT)
"""

from rf_features.components import (
    GERF,
    OPRF,
    SADERF,
    PosRF,
    PosRFHyp,
    TrigRF,
    gerf_log_features,
    gerf_log_form,
    gerf_relative_variance,
    mean_pair_sqnorm,
    oprf_optimal_a,
    saderf_psi,
)
from rf_features.feature_map import KERNELS, ExponentialForm, FeatureMap, masked_mean
from rf_features.kernels import gaussian_kernel, relative_mse, softmax_kernel
from rf_features.registry import COMPONENTS, create, names, register

__all__ = [
    "COMPONENTS",
    "GERF",
    "KERNELS",
    "OPRF",
    "SADERF",
    "ExponentialForm",
    "FeatureMap",
    "PosRF",
    "PosRFHyp",
    "TrigRF",
    "create",
    "gaussian_kernel",
    "gerf_log_features",
    "gerf_log_form",
    "gerf_relative_variance",
    "masked_mean",
    "mean_pair_sqnorm",
    "names",
    "oprf_optimal_a",
    "register",
    "relative_mse",
    "saderf_psi",
    "softmax_kernel",
]
