"""The Triton backend's entry point: inputs ``(..., N, d)`` flattened to sequences, then the mode's kernel."""

from __future__ import annotations

import math

import torch

from rf_attention.ops.features import ClosedForm


def closed_form_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    closed: ClosedForm,
    *,
    causal: bool,
    eps: float,
    chunk_size: int | None,
) -> torch.Tensor:
    """RF attention of ``q (..., N_q, d)``, ``k (..., N_k, d)``, ``v (..., N_k, Dv)`` by the Triton kernels.

    ``key_mask`` bool ``(..., N_k)`` (True at padding) or None; ``closed`` the features of inputs flattened
    to ``prod(...)`` sequences; ``chunk_size`` the causal chunk (a power of two, 16 to 128; None: the
    kernel's default). Inputs may be float32, float16 or bfloat16 (cast to float32 in the kernels); the
    output has ``v``'s dtype.
    """
    lead = q.shape[:-2]
    size = math.prod(lead)
    q, k, v = (x.reshape(size, *x.shape[-2:]) for x in (q, k, v))
    mask = None if key_mask is None else key_mask.reshape(size, key_mask.shape[-1])
    if causal:
        from rf_attention.ops.triton.chunk import chunk_attention

        out = chunk_attention(q, k, v, mask, closed, eps, chunk_size)
    else:
        from rf_attention.ops.triton.noncausal import noncausal_attention

        out = noncausal_attention(q, k, v, mask, closed, eps)
    return out.reshape(*lead, *out.shape[-2:])
