"""The efficient-attention baselines of the Spectraformer paper's Table 1, one module each.

Importing this package registers ``nystromformer``, ``skyformer``, ``linformer``, ``bigbird``, ``reformer``
and ``informer`` in [`rf_attention.create`][rf_attention.create].
[`StepDraws`][rf_attention.baselines.StepDraws] is how the random ones draw: once per training step,
repeated in eval.
"""

from rf_attention.baselines._common import StepDraws
from rf_attention.baselines.bigbird import BigBirdAttention
from rf_attention.baselines.informer import InformerAttention
from rf_attention.baselines.linformer import LinformerAttention
from rf_attention.baselines.nystromformer import NystromformerAttention
from rf_attention.baselines.reformer import ReformerAttention, SharedQueryKeyValue
from rf_attention.baselines.skyformer import SkyformerAttention, gaussian_kernel_attention

__all__ = [
    "BigBirdAttention",
    "InformerAttention",
    "LinformerAttention",
    "NystromformerAttention",
    "ReformerAttention",
    "SharedQueryKeyValue",
    "SkyformerAttention",
    "StepDraws",
    "gaussian_kernel_attention",
]
