"""Attention as functions on ``(B, H, N, Dh)`` tensors: kernelized (linear-time) and exact softmax."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from rf_features import FeatureMap

#: Denominators with ``|D| < DEFAULT_EPS`` are replaced by it (features are stabilized to at most 1).
DEFAULT_EPS = 1e-6
#: Query/key block of the causal algorithm.
DEFAULT_CHUNK_SIZE = 128
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def linear_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    key_log_scale: torch.Tensor | None = None,
    eps: float = DEFAULT_EPS,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> torch.Tensor:
    """Kernelized attention ``D^-1 (phi_q phi_k^T) v`` in O(N) time and memory (Eq. 7, Figure 1).

    Non-causal: ``phi_q (phi_k^T v) / (phi_q (phi_k^T 1))``. Causal: the sums run over keys ``j <= i``,
    computed by chunked prefix sums: within a chunk of ``chunk_size`` positions an explicit masked
    ``chunk x chunk`` product, across chunks a running ``m x Dv`` state carried from chunk to chunk (no
    ``N x N`` matrix, no state per position; memory ``O(N (m + Dv))`` plus the chunk states autograd keeps).

    Args:
        phi_q: ``(..., N_q, m)`` query features.
        phi_k: ``(..., N_k, m)`` key features.
        v: ``(..., N_k, Dv)`` values.
        causal: query ``i`` attends to keys ``j <= i`` (needs ``N_q == N_k``).
        key_padding_mask: bool ``(B, N_k)``, True at padding; padded keys contribute nothing, and a row whose
            keys are all padding gives zeros.
        key_log_scale: ``(..., N_k)``: the true key features are ``phi_k * exp(key_log_scale)`` (as returned
            by ``FeatureMap.forward_with_key_scales``). Each query ``i`` divides them by one constant, the
            largest scale over the keys it sees (causal: over ``j <= i`` only), so nothing overflows and no
            position depends on a later one.
        eps: denominators with ``|D| < eps`` are replaced by ``eps`` (features with signs, as TrigRF's or
            negative quadrature weights give, can make ``D`` vanish; all-padding rows have ``D = 0``).
        chunk_size: positions per chunk of the causal algorithm.

    Returns:
        ``(..., N_q, Dv)`` in ``v``'s dtype; float16/bfloat16 inputs are accumulated in float32.
    """
    _check_shapes(phi_q, phi_k, v, causal)
    out_dtype = v.dtype
    acc = torch.promote_types(torch.promote_types(phi_q.dtype, phi_k.dtype), v.dtype)
    if acc in _LOW_PRECISION:
        acc = torch.float32
    phi_q, phi_k, v = phi_q.to(acc), phi_k.to(acc), v.to(acc)
    mask = _broadcast_key_mask(key_padding_mask, phi_k)
    scale = None if key_log_scale is None else key_log_scale.to(acc)
    if mask is not None:
        phi_k = phi_k.masked_fill(mask.unsqueeze(-1), 0.0)
        if scale is not None:
            scale = scale.masked_fill(mask, -math.inf)
    if causal:
        num, den = _causal_sums(phi_q, phi_k, v, scale, chunk_size)
    else:
        if scale is not None:
            top = scale.amax(dim=-1, keepdim=True)
            top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
            phi_k = phi_k * torch.exp(scale - top).unsqueeze(-1)
        num = phi_q @ (phi_k.mT @ v)
        den = phi_q @ phi_k.sum(dim=-2).unsqueeze(-1)
    den = torch.where(den.abs() < eps, torch.full_like(den, eps), den)
    return (num / den).to(out_dtype)


def _causal_sums(
    phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, scale: torch.Tensor | None, chunk_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Numerators ``(..., N, Dv)`` and denominators ``(..., N, 1)`` of causal linear attention.

    With scales, query ``i`` uses the reference ``M_i = max_{j <= i} scale_j`` (a running maximum): the
    carried state is kept relative to the reference at the end of the previous chunk and rescaled by
    ``exp(M_prev - M_i) <= 1`` when used; within a chunk, key ``j <= i`` weighs ``exp(scale_j - M_i) <= 1``.
    """
    n = phi_q.shape[-2]
    lead = phi_q.shape[:-2]
    if scale is None:
        reference = None
    else:
        reference = torch.cummax(scale, dim=-1).values
        # Positions that have seen only padding have no key to attend to; any value not above the later
        # references keeps the zero state zero.
        finite = torch.isfinite(reference)
        floor = torch.where(finite, reference, torch.full_like(reference, math.inf)).amin(
            dim=-1, keepdim=True
        )
        floor = torch.where(torch.isfinite(floor), floor, torch.zeros_like(floor))
        reference = torch.where(finite, reference, floor)
    state = phi_k.new_zeros(*lead, phi_k.shape[-1], v.shape[-1])
    normalizer = phi_k.new_zeros(*lead, phi_k.shape[-1], 1)
    previous = None if reference is None else reference[..., :1]
    nums, dens = [], []
    for start in range(0, n, chunk_size):
        stop = min(start + chunk_size, n)
        q_c, k_c, v_c = phi_q[..., start:stop, :], phi_k[..., start:stop, :], v[..., start:stop, :]
        causal_mask = torch.ones(stop - start, stop - start, dtype=torch.bool, device=q_c.device).tril()
        scores = q_c @ k_c.mT
        if reference is None:
            scores = scores.masked_fill(~causal_mask, 0.0)
            num, den = q_c @ state + scores @ v_c, q_c @ normalizer + scores.sum(-1, keepdim=True)
            state = state + k_c.mT @ v_c
            normalizer = normalizer + k_c.sum(dim=-2).unsqueeze(-1)
        else:
            ref_c, scale_c = reference[..., start:stop], scale[..., start:stop]
            exponent = (scale_c.unsqueeze(-2) - ref_c.unsqueeze(-1)).masked_fill(~causal_mask, -math.inf)
            scores = scores * torch.exp(exponent)
            carry = torch.exp(previous - ref_c).unsqueeze(-1)
            num = (q_c @ state) * carry + scores @ v_c
            den = (q_c @ normalizer) * carry + scores.sum(-1, keepdim=True)
            end = ref_c[..., -1:]
            decay = torch.exp(previous - end).unsqueeze(-1)
            k_scaled = k_c * torch.exp(scale_c - end).unsqueeze(-1)
            state = state * decay + k_scaled.mT @ v_c
            normalizer = normalizer * decay + k_scaled.sum(dim=-2).unsqueeze(-1)
            previous = end
        nums.append(num)
        dens.append(den)
    return torch.cat(nums, dim=-2), torch.cat(dens, dim=-2)


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Exact attention ``softmax(q k^T / sqrt(Dh)) v`` (Eq. 6), by ``scaled_dot_product_attention``.

    The reference every approximation is tested against. Rows whose keys are all padding give zeros.

    Args:
        q: ``(B, H, N_q, Dh)``.
        k: ``(B, H, N_k, Dh)``.
        v: ``(B, H, N_k, Dv)``.
        causal: query ``i`` attends to keys ``j <= i``.
        key_padding_mask: bool ``(B, N_k)``, True at padding.
        dropout_p: dropout on the attention probabilities (use only in training).

    Returns:
        ``(B, H, N_q, Dv)``.
    """
    _check_shapes(q, k, v, causal)
    if key_padding_mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=dropout_p)
    mask = _broadcast_key_mask(key_padding_mask, k)
    allowed = (~mask).unsqueeze(-2).expand(*q.shape[:-1], k.shape[-2])  # (B, H, N_q, N_k)
    if causal:
        allowed = allowed & torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    empty = ~allowed.any(dim=-1, keepdim=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | empty, dropout_p=dropout_p)
    return out.masked_fill(empty, 0.0)


def rf_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    feature_map: FeatureMap,
    *,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    query_padding_mask: torch.Tensor | None = None,
    eps: float = DEFAULT_EPS,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> torch.Tensor:
    """Random-feature attention approximating ``softmax_attention(q, k, v)`` in O(N).

    ``q`` and ``k`` are scaled by ``Dh^-1/4`` each (so ``phi(q) . phi(k) ~ exp(q . k / sqrt(Dh))``), mapped by
    ``feature_map`` with each query row and the keys stabilized (non-causal: one constant for all keys;
    causal: per-key scales that [`linear_attention`][rf_attention.linear_attention] combines over past keys
        only), and combined by
    [`linear_attention`][rf_attention.linear_attention].

    Args:
        q: ``(B, H, N_q, Dh)``.
        k: ``(B, H, N_k, Dh)``.
        v: ``(B, H, N_k, Dv)``.
        feature_map: an ``rf_features.FeatureMap`` of dimension ``Dh``. In causal mode a map with
            data-dependent statistics (OPRF, SADERF) must use ``statistics_mode="running"``.
        causal: query ``i`` attends to keys ``j <= i``.
        key_padding_mask: bool ``(B, N_k)``, True at padding.
        query_padding_mask: bool ``(B, N_q)``, True at padding (left out of the feature map's statistics;
            self-attention passes the same mask as ``key_padding_mask``).
        eps: see [`linear_attention`][rf_attention.linear_attention].
        chunk_size: see [`linear_attention`][rf_attention.linear_attention].

    Returns:
        ``(B, H, N_q, Dv)``.
    """
    if causal and feature_map.statistics_mode == "batch" and feature_map.running_statistics_defaults():
        raise ValueError(
            f"feature_map: {type(feature_map).__name__} computes statistics over the whole sequence, which "
            "would let a position see later ones; create it with statistics_mode='running' for causal "
            "attention"
        )
    scale = q.shape[-1] ** -0.25
    masks = {"key_padding_mask": key_padding_mask, "query_padding_mask": query_padding_mask}
    if causal:
        phi_q, phi_k, key_log_scale = feature_map.forward_with_key_scales(q * scale, k * scale, **masks)
    else:  # one maximum over all keys is causal-safe here
        phi_q, phi_k = feature_map(q * scale, k * scale, stabilize=True, **masks)
        key_log_scale = None
    return linear_attention(
        phi_q,
        phi_k,
        v,
        causal=causal,
        key_padding_mask=key_padding_mask,
        key_log_scale=key_log_scale,
        eps=eps,
        chunk_size=chunk_size,
    )


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() < 2 or not x.is_floating_point():
            raise ValueError(f"{name}: expected a floating-point tensor (..., N, D), got {x!r:.60}")
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-1] != v.shape[:-1] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            "q, k, v: expected shapes (..., N_q, D), (..., N_k, D), (..., N_k, Dv) with the same leading "
            f"shape, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal: needs as many queries as keys, got {q.shape[-2]} and {k.shape[-2]}")


def _broadcast_key_mask(mask: torch.Tensor | None, k: torch.Tensor) -> torch.Tensor | None:
    """A ``(B, N_k)`` padding mask broadcast to ``k.shape[:-1]``."""
    if mask is None:
        return None
    if mask.dtype != torch.bool or mask.shape != (k.shape[0], k.shape[-2]):
        raise ValueError(
            f"key_padding_mask: expected a bool tensor of shape (B, N_k) = {(k.shape[0], k.shape[-2])}, "
            f"got {mask.dtype} {tuple(mask.shape)}"
        )
    mask = mask.to(k.device)
    return mask.view(mask.shape[0], *([1] * (k.dim() - 3)), mask.shape[1]).expand(k.shape[:-1])
