"""The chunked non-causal kernel (Eq. 7): key sums by groups of keys, outputs by groups of queries.

A group of keys gives its ``m x (Dv + 1)`` sums ``phi_k^T [v, 1]`` by one matmul; a group of queries reads
them by one matmul.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rf_attention.ops.common import (
    FeatureFn,
    Gradients,
    accumulate,
    finite_or_zero,
    group_rows,
    guard_gradient,
    guarded_denominator,
    mask_part,
    recomputed,
    row_groups,
    row_slices,
    with_ones,
)
from rf_attention.ops.features import (
    FeatureSide,
    closed_form_features,
    closed_form_vjp,
    exp_features,
    flat_sides,
)
from rf_features import ExponentialForm


def _key_sums(
    features: FeatureFn, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Key sums of one group, each feature column ``l`` divided by ``exp(M_l)``, ``M_l = max_j log phi_k``.

    Returns ``phi_k^T [v, 1]`` ``(..., m, Dv + 1)``, ``sum_j |phi_k_j|`` ``(..., 1, m)`` for signed features
    (else None), and ``M`` ``(..., 1, m)`` (``-inf`` where every key is padding; detached).
    """
    log_k, mult_k = features(k, False)
    if mask is not None:
        log_k = log_k.masked_fill(mask[..., None], -math.inf)
    top = log_k.detach().amax(dim=-2, keepdim=True)
    phi_k = exp_features(log_k - finite_or_zero(top), mult_k)
    magnitude = phi_k.abs().sum(dim=-2, keepdim=True) if mult_k is not None else None
    return phi_k.mT @ with_ones(v), magnitude, top


def _query_outputs(
    features: FeatureFn,
    q: torch.Tensor,
    state: torch.Tensor,
    magnitude: torch.Tensor | None,
    reference: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """Outputs ``(..., n, Dv)`` of one group of queries against the key sums ``state`` (Eq. 7).

    The query features are multiplied by the keys' column scales ``exp(reference)`` and each row divided by
    its largest entry; with positive features every normalizer is then at least 1 (0 without keys).
    """
    log_q, mult_q = features(q, True)
    log_q = log_q + reference
    phi_q = exp_features(log_q - log_q.detach().amax(dim=-1, keepdim=True), mult_q)
    y = phi_q @ state
    bound = None
    if magnitude is not None or mult_q is not None:
        normalizer = magnitude if magnitude is not None else state[..., -1:].mT
        bound = phi_q.detach().abs() @ normalizer.detach().mT
    den, _ = guarded_denominator(y[..., -1:], bound, eps)
    return y[..., :-1] / den


def noncausal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    features: FeatureFn,
    *,
    width: int,
    rows: int | None,
    eps: float,
) -> torch.Tensor:
    """``phi_q (phi_k^T v) / (phi_q phi_k^T 1)`` by groups of rows (Eq. 7).

    Key groups' sums are combined by their column maxima (the sums of a group with a smaller maximum are
    scaled down by ``exp(M_g - M)``), so keys are divided per feature column by ``exp(M_l)``, which moves to
    the query side: the scale of the normalizer is never lost, whatever the logits.

    Args:
        q: ``(..., N_q, d)``.
        k: ``(..., N_k, d)``.
        v: ``(..., N_k, Dv)``.
        key_mask: bool ``(..., N_k)``, True at padding, or None.
        features: the feature map of queries and keys.
        width: ``m``, the feature width (for the group rule).
        rows: rows per group; None: [`group_rows`][rf_attention.ops.common.group_rows].
        eps: relative guard of the normalizer.
    """
    key_rows = rows or group_rows(k.shape[-2], k.shape[-1], width)
    sums = [
        recomputed(_key_sums, features, k[..., part, :], v[..., part, :], mask_part(key_mask, part))
        for part in row_slices(k.shape[-2], key_rows)
    ]
    column_max = sums[0][2]
    for _, _, top in sums[1:]:
        column_max = torch.maximum(column_max, top)
    reference = finite_or_zero(column_max)
    state: torch.Tensor | None = None
    magnitude: torch.Tensor | None = None
    for group_state, group_magnitude, top in sums:
        decay = torch.exp(top - reference)  # 0 for a column whose keys in the group are all padding
        scaled = group_state * decay.mT
        state = scaled if state is None else state + scaled
        if group_magnitude is not None:
            scaled_magnitude = group_magnitude * decay
            magnitude = scaled_magnitude if magnitude is None else magnitude + scaled_magnitude
    assert state is not None, "k has at least one row"
    query_rows = rows or group_rows(q.shape[-2], q.shape[-1], width)
    outs = [
        recomputed(_query_outputs, features, q[..., part, :], state, magnitude, reference, eps)
        for part in row_slices(q.shape[-2], query_rows)
    ]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)


class _NonCausal(torch.autograd.Function):
    """Non-causal attention with closed-form features (Eq. 7); the backward recomputes each group's features.

    Saved: the inputs, the key sums and column maxima, the outputs and normalizers; never ``N x m`` features.
    """

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        key_mask: torch.Tensor | None,
        query_projection: torch.Tensor,
        query_offset: torch.Tensor,
        key_projection: torch.Tensor,
        key_offset: torch.Tensor,
        query_sign: torch.Tensor | None,
        trigonometric: bool,
        query_rows: int,
        key_rows: int,
        eps: float,
    ) -> torch.Tensor:
        ks = FeatureSide(key_projection, key_offset, None, trigonometric)
        tops, sums, magnitudes = [], [], []
        key_parts = k.split(key_rows, dim=1)
        key_masks = row_groups(key_mask, key_rows, len(key_parts))
        for k_part, v_part, mask in zip(key_parts, v.split(key_rows, dim=1), key_masks, strict=True):
            f, top = closed_form_features(k_part, ks, mask, "column")
            tops.append(top)
            sums.append(torch.bmm(f.phi.mT, with_ones(v_part)))
            if trigonometric:
                magnitudes.append(f.phi.abs().sum(dim=-2, keepdim=True))
            del f  # a group's features are freed before the next group's are made
        top_all = torch.stack(tops)  # (groups, G, 1, m)
        reference = finite_or_zero(top_all.amax(dim=0))
        decay = torch.exp(top_all - reference)
        state = (torch.stack(sums) * decay.mT).sum(dim=0)  # (G, m, Dv + 1)
        normalizer = None
        if trigonometric:
            normalizer = (torch.stack(magnitudes) * decay).sum(dim=0)
        elif query_sign is not None:
            normalizer = state[..., -1:].mT
        qs = FeatureSide(query_projection, query_offset + reference, query_sign, trigonometric)
        out = v.new_empty(*q.shape[:-1], v.shape[-1])
        den = v.new_empty(*q.shape[:-1], 1)
        free = torch.empty(den.shape, dtype=torch.bool, device=den.device)
        groups = zip(*(x.split(query_rows, dim=1) for x in (q, out, den, free)), strict=True)
        for q_part, out_part, den_part, free_part in groups:
            f, _ = closed_form_features(q_part, qs, None, "row")
            y = torch.bmm(f.phi, state)
            bound = None if normalizer is None else torch.bmm(f.phi.abs(), normalizer.mT)
            den_y, guarded = guarded_denominator(y[..., -1:], bound, eps)
            out_part.copy_(y[..., :-1] / den_y)
            den_part.copy_(den_y)
            free_part.copy_(~guarded)
            del f, y, bound, den_y, guarded
        ctx.save_for_backward(
            q, k, v, key_mask, query_projection, query_offset, key_projection, key_offset, query_sign,
            state, reference, den, free,
        )  # fmt: skip
        ctx.config = (trigonometric, query_rows, key_rows)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (
            q, k, v, key_mask, query_projection, query_offset, key_projection, key_offset, query_sign,
            state, reference, den, free,
        ) = ctx.saved_tensors  # fmt: skip
        trigonometric, query_rows, key_rows = ctx.config
        qs = FeatureSide(query_projection, query_offset + reference, query_sign, trigonometric)
        ks = FeatureSide(key_projection, key_offset, None, trigonometric)
        grads = Gradients(q, k, v, (query_rows, key_rows))
        grad_state: torch.Tensor | None = None
        groups = zip(*(x.split(query_rows, dim=1) for x in (q, den, free, grad_out)), strict=True)
        for index, (q_part, den_part, free_part, grad_part) in enumerate(groups):
            f, _ = closed_form_features(q_part, qs, None, "row")
            out_part = torch.bmm(f.phi, state[..., :-1]).div_(den_part)  # recomputed, not kept
            gy = guard_gradient(out_part, den_part, free_part.to(den.dtype), grad_part)
            grad_state = accumulate(grad_state, torch.bmm(f.phi.mT, gy))
            gx, gp, gb = closed_form_vjp(torch.bmm(gy, state.mT), q_part, f, qs)
            grads.q_parts[index].copy_(gx)
            grads.side(0, gp, gb)
            del f, out_part, gy, gx
        assert grad_state is not None, "q has at least one row"
        key_parts = k.split(key_rows, dim=1)
        key_masks = row_groups(key_mask, key_rows, len(key_parts))
        groups_k = zip(key_parts, v.split(key_rows, dim=1), key_masks, strict=True)
        for index, (k_part, v_part, mask) in enumerate(groups_k):
            # relative to the column maxima of all keys
            f, _ = closed_form_features(k_part, ks, mask, reference)
            grads.v_parts[index].copy_(torch.bmm(f.phi, grad_state[..., :-1]))
            gx, gp, gb = closed_form_vjp(torch.bmm(with_ones(v_part), grad_state.mT), k_part, f, ks)
            grads.k_parts[index].copy_(gx)
            grads.side(1, gp, gb)
            del f, gx
        return grads.result()


def closed_form_noncausal(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    query_form: ExponentialForm,
    key_form: ExponentialForm,
    *,
    rows: int | None,
    eps: float,
) -> torch.Tensor:
    """Non-causal attention with closed-form features and hand-written backward passes.

    Args:
        q: ``(..., N_q, d)``, in the accumulation dtype.
        k: ``(..., N_k, d)``.
        v: ``(..., N_k, Dv)``.
        key_mask: bool ``(..., N_k)``, True at padding, or None.
        query_form: the queries' features (``rf_features.ExponentialForm``).
        key_form: the keys' features.
        rows: rows per group; None: [`group_rows`][rf_attention.ops.common.group_rows].
        eps: relative guard of the normalizer.

    Returns:
        ``(..., N_q, Dv)``.
    """
    lead = q.shape[:-2]
    size = math.prod(lead)
    sides = flat_sides(query_form, key_form, lead, q.dtype)
    width = sides[1].shape[-1]
    flat = [x.reshape(size, *x.shape[-2:]) for x in (q, k, v)]
    mask = None if key_mask is None else key_mask.reshape(size, key_mask.shape[-1])
    query_rows = rows or group_rows(q.shape[-2], q.shape[-1], width, batch=size)
    key_rows = rows or group_rows(k.shape[-2], k.shape[-1], width, batch=size)
    out = _NonCausal.apply(*flat, mask, *sides, query_form.trigonometric, query_rows, key_rows, eps)
    return out.reshape(*lead, *out.shape[-2:])
