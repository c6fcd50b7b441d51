"""Causal RF attention of new tokens after a recurrent state: the one function the HF cache calls.

A private adapter over [`causal_prefill`][rf_attention.decoding.causal_prefill] and
[`recurrent_attention`][rf_attention.decoding.recurrent_attention], with the signature of the recurrent
form's ``decode``.
"""

from __future__ import annotations

import torch

import rf_features
from rf_attention.decoding import RecurrentState, causal_prefill, recurrent_attention
from rf_attention.functional import _accumulation_dtype


def decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    feature_map: rf_features.FeatureMap,
    state: RecurrentState | None,
    *,
    key_padding_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, RecurrentState]:
    """Causal RF attention of ``T`` new tokens ``q, k, v (B, H, T, Dh)`` after ``state`` (None: none yet).

    ``scale`` is the logit scale (default ``Dh ** -0.5``), applied as its square root to ``q`` and ``k``.

    Returns:
        ``(out (B, H, T, Dv) in v's dtype, the state after the T tokens)``.
    """
    acc = _accumulation_dtype(q, k, v)
    root = (q.shape[-1] ** -0.5 if scale is None else scale) ** 0.5
    query_padding = None if state is not None else key_padding_mask
    phi_q, phi_k, log_scale = feature_map.forward_with_key_scales(
        q.to(acc) * root,
        k.to(acc) * root,
        key_padding_mask=key_padding_mask,
        query_padding_mask=query_padding,
    )
    if state is None:
        return causal_prefill(phi_q, phi_k, log_scale, v, key_padding_mask=key_padding_mask)
    state.check_fits(tuple(q.shape[:2]), phi_k.shape[-1], v.shape[-1])
    out, state = recurrent_attention(state, phi_q, phi_k, log_scale, v)
    return out.to(v.dtype), state
