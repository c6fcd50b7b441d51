"""The baselines RaLiMP is compared with: EUGen, SNNK, a low-rank factorization and the dense layer.

All take the same constructor style as [`ralimp.RaLiMP`][ralimp.RaLiMP] (``in_features, out_features, *,
activation, ..., bias, weight_matrix, seed``) and ``from_linear(linear, activation, **kw)``
([`ralimp.LinearReplacement`][ralimp.LinearReplacement]).
"""

from ralimp.baselines.dense import Dense
from ralimp.baselines.eugen import EUGen
from ralimp.baselines.lowrank import LowRank
from ralimp.baselines.snnk import SNNK

__all__ = ["SNNK", "Dense", "EUGen", "LowRank"]
