"""Linear-time kernelized attention, exact softmax attention and efficient-attention baselines.

Every ``"<component>-<matrix>"`` pair of ``rf_features`` and ``rf_matrices`` is an attention:

    import rf_attention
    attn = rf_attention.create("oprf-fastfoodl", dim=64, num_heads=2, num_features=128)
    y = attn(x, key_padding_mask=mask)   # (B, N, 64) -> (B, N, 64)
    y = attn(x, context=memory, context_padding_mask=memory_mask)   # cross-attention

Packed sequences: ``rf_attention.rf_attention(q, k, v, fm, cu_seqlens=...)`` (``rf_attention.varlen``);
Hugging Face models, ``generate()`` included: ``rf_attention.hf`` (extra ``rf-attention[hf]``).
Linearizing a pretrained softmax model (learnable maps, ``create(..., learnable=True)``):
``rf_attention.transfer.attention_transfer``.
"""

from rf_attention import decoding, naive, transfer, varlen
from rf_attention.baselines import (
    BigBirdAttention,
    InformerAttention,
    LinformerAttention,
    NystromformerAttention,
    ReformerAttention,
    SkyformerAttention,
)
from rf_attention.decoding import KVCache, RecurrentState
from rf_attention.functional import linear_attention, rf_attention, softmax_attention
from rf_attention.modules import MultiheadSelfAttention, RandomFeatureAttention, SoftmaxAttention
from rf_attention.registry import ATTENTIONS, create, names, register, split_pair

__all__ = [
    "ATTENTIONS",
    "BigBirdAttention",
    "InformerAttention",
    "KVCache",
    "LinformerAttention",
    "MultiheadSelfAttention",
    "NystromformerAttention",
    "RandomFeatureAttention",
    "RecurrentState",
    "ReformerAttention",
    "SkyformerAttention",
    "SoftmaxAttention",
    "create",
    "decoding",
    "linear_attention",
    "naive",
    "names",
    "register",
    "rf_attention",
    "softmax_attention",
    "split_pair",
    "transfer",
    "varlen",
]
