"""Component functions and random feature maps for the softmax kernel (Spectraformer Section 3.2).

Any component function (``trigrf``, ``posrf``, ``posrf-hyp``, ``gerf``, ``oprf``, ``saderf``) combines with
any ``rf_matrices`` weight matrix:

    import rf_features
    fm = rf_features.create("oprf", weight_matrix="sgq", num_features=128, dim=32)
    phi_q, phi_k = fm(q, k)   # phi_q @ phi_k.mT ~ exp(q @ k.mT)

Learned maps, the conversion baselines (``learned_names()``: ``hedgehog``, ``t2r``), are feature maps too,
whose product is a learned kernel rather than an estimate (`rf_features.learned`).
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
from rf_features.feature_map import (
    KERNELS,
    ExponentialForm,
    FeatureContract,
    FeatureMap,
    LogFeatures,
    masked_mean,
)
from rf_features.kernels import gaussian_kernel, relative_mse, softmax_kernel
from rf_features.learned import HedgehogFeatureMap, LearnedFeatureMap, T2RFeatureMap
from rf_features.registry import COMPONENTS, LEARNED, create, learned_names, names, register

__all__ = [
    "COMPONENTS",
    "GERF",
    "KERNELS",
    "LEARNED",
    "OPRF",
    "SADERF",
    "ExponentialForm",
    "FeatureContract",
    "FeatureMap",
    "HedgehogFeatureMap",
    "LearnedFeatureMap",
    "LogFeatures",
    "PosRF",
    "PosRFHyp",
    "T2RFeatureMap",
    "TrigRF",
    "create",
    "gaussian_kernel",
    "gerf_log_features",
    "gerf_log_form",
    "gerf_relative_variance",
    "learned_names",
    "masked_mean",
    "mean_pair_sqnorm",
    "names",
    "oprf_optimal_a",
    "register",
    "relative_mse",
    "saderf_psi",
    "softmax_kernel",
]
