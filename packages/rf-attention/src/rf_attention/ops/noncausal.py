"""The chunked non-causal kernel (Eq. 7): key sums by groups of keys, outputs by groups of queries.

A group of keys gives its ``m x (Dv + 1)`` sums ``phi_k^T [v, 1]`` by one matmul, each feature column
divided by its largest entry in the group; the groups' sums are combined by their column maxima (a group
with a smaller maximum is scaled down by ``exp(M_g - M) <= 1``), so keys are divided per column by
``exp(M_l)``, which moves to the query side: the scale of the normalizer is never lost, whatever the
logits. A group of queries reads the sums by one matmul, each row divided by its largest entry.

One loop, [`noncausal_attention`][rf_attention.ops.noncausal.noncausal_attention], takes the feature
strategy: a closed form runs each group as a ``torch.autograd.Function`` whose backward recomputes the
group's features and applies hand-written VJPs; any other ``FeatureFn`` runs each group under
``torch.utils.checkpoint`` (autograd's backward through the same operations).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rf_attention.ops.common import (
    FeatureFn,
    finite_or_zero,
    group_rows,
    guard_gradient,
    guarded_denominator,
    recomputed,
    row_groups,
    with_ones,
)
from rf_attention.ops.features import (
    ClosedForm,
    Features,
    FeatureSide,
    closed_form_features,
    closed_form_vjp,
    flattened,
    stabilized,
)


def key_sums(
    features: FeatureFn, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, in_place: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Key sums of one group, each feature column ``l`` divided by ``exp(M_l)``, ``M_l = max_j log phi_k``.

    Args:
        features: the feature map (``FeatureFn``) of ``k (G, n, d)``.
        k: ``(G, n, d)``.
        v: ``(G, n, Dv)``.
        mask: bool ``(G, n)``, True at padding, or None.
        in_place: stabilize the log-features in place (nothing records them).

    Returns:
        ``phi_k^T [v, 1]`` ``(G, m, Dv + 1)``, ``sum_j |phi_k_j|`` ``(G, 1, m)`` for signed features (else
        None), and ``M`` ``(G, 1, m)`` (``-inf`` where every key is padding; detached).
    """
    log_k, mult_k = features(k, False)
    phi_k, top = stabilized(log_k, mult_k, mask, "column", in_place=in_place)
    magnitude = phi_k.abs().sum(dim=-2, keepdim=True) if mult_k is not None else None
    return torch.bmm(phi_k.mT, with_ones(v)), magnitude, top


def read_state(
    phi_q: torch.Tensor, state: torch.Tensor, magnitude: torch.Tensor | None, signed: bool, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``phi_q [S, z] / guard(phi_q z)`` ``(G, n, Dv)`` (Eq. 7), the guarded normalizer, where it was guarded.

    ``phi_q (G, n, m)``, ``state = [S, z]`` ``(G, m, Dv + 1)``. The guard's bound for signed features is
    ``|phi_q| . sum_j |phi_k_j|`` with ``magnitude`` ``(G, 1, m)`` those sums (None: the keys' features are
    positive, ``z`` itself); positive features have no bound.
    """
    normalizer = magnitude if magnitude is not None or not signed else state[..., -1:].mT
    y = torch.bmm(phi_q, state)
    bound = None if normalizer is None else torch.bmm(phi_q.detach().abs(), normalizer.detach().mT)
    den, guarded = guarded_denominator(y[..., -1:], bound, eps)
    return y[..., :-1] / den, den, guarded


def query_outputs(
    features: FeatureFn,
    q: torch.Tensor,
    state: torch.Tensor,
    magnitude: torch.Tensor | None,
    reference: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    """Outputs ``(G, n, Dv)`` of one group of queries against the key sums ``state`` (Eq. 7).

    The query features are multiplied by the keys' column scales ``exp(reference)`` (None: already in
    the features) and each row divided by its largest entry; with positive features every normalizer is
    then at least 1 (0 without keys).
    """
    log_q, mult_q = features(q, True)
    phi_q, _ = stabilized(log_q if reference is None else log_q + reference, mult_q, None, "row")
    return read_state(phi_q, state, magnitude, mult_q is not None, eps)[0]


class _ClosedKeySums(torch.autograd.Function):
    """[`key_sums`][rf_attention.ops.noncausal.key_sums] of closed-form features, hand-written VJP."""

    @staticmethod
    def forward(
        ctx: Any,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        projection: torch.Tensor,
        square: torch.Tensor,
        offset: torch.Tensor,
        wave_shift: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        side = FeatureSide(projection, square, offset, None, wave_shift)
        sums, magnitude, top = key_sums(ClosedForm(side, side).log_features, k, v, mask, in_place=True)
        ctx.save_for_backward(k, v, mask, projection, square, offset, wave_shift, top)
        ctx.mark_non_differentiable(top, *([] if magnitude is None else [magnitude]))
        return sums, magnitude, top

    @staticmethod
    def backward(ctx: Any, grad_sums: torch.Tensor, *_unused: Any) -> tuple[torch.Tensor | None, ...]:
        k, v, mask, projection, square, offset, wave_shift, top = ctx.saved_tensors
        side = FeatureSide(projection, square, offset, None, wave_shift)
        f, _ = closed_form_features(k, side, mask, top)
        grad_v = torch.bmm(f.phi, grad_sums[..., :-1])
        grad_k, *grad_side = closed_form_vjp(
            torch.bmm(with_ones(v), grad_sums.mT), k, f, side, parameters=any(ctx.needs_input_grad[3:6])
        )
        return grad_k, grad_v, None, *grad_side, None


class _ClosedQueries(torch.autograd.Function):
    """[`query_outputs`][rf_attention.ops.noncausal.query_outputs] of closed-form features, hand-written VJP.

    Saved: the group's queries, the state and the guarded normalizers; never its ``n x m`` features.
    """

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        state: torch.Tensor,
        magnitude: torch.Tensor | None,
        projection: torch.Tensor,
        square: torch.Tensor,
        offset: torch.Tensor,
        sign: torch.Tensor | None,
        wave_shift: torch.Tensor | None,
        eps: float,
    ) -> torch.Tensor:
        side = FeatureSide(projection, square, offset, sign, wave_shift)
        f, _ = closed_form_features(q, side, None, "row")
        out, den, guarded = read_state(f.phi, state, magnitude, sign is not None or side.trigonometric, eps)
        ctx.save_for_backward(q, state, projection, square, offset, sign, wave_shift, den, guarded)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, state, projection, square, offset, sign, wave_shift, den, guarded = ctx.saved_tensors
        side = FeatureSide(projection, square, offset, sign, wave_shift)
        f, _ = closed_form_features(q, side, None, "row")
        out = torch.bmm(f.phi, state[..., :-1]).div_(den)  # recomputed, not kept
        grad_y = guard_gradient(out, den, (~guarded).to(den.dtype), grad_out)
        grad_state = torch.bmm(f.phi.mT, grad_y)
        grad_q, *grad_side = closed_form_vjp(
            torch.bmm(grad_y, state.mT), q, f, side, parameters=any(ctx.needs_input_grad[3:6])
        )
        return grad_q, grad_state, None, *grad_side, None, None, None


def _key_group(
    features: Features, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    if isinstance(features, ClosedForm):
        side = features.key
        return _ClosedKeySums.apply(k, v, mask, side.projection, side.square, side.offset, side.wave_shift)
    return recomputed(key_sums, features, k, v, mask)


def _query_group(
    features: Features,
    q: torch.Tensor,
    state: torch.Tensor,
    magnitude: torch.Tensor | None,
    reference: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    if isinstance(features, ClosedForm):
        side = features.query
        offset = side.offset + reference  # the keys' column scales, folded into the offset
        return _ClosedQueries.apply(
            q, state, magnitude, side.projection, side.square, offset, side.sign, side.wave_shift, eps
        )
    return recomputed(query_outputs, features, q, state, magnitude, reference, eps)


def noncausal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    features: Features,
    *,
    width: int,
    eps: float,
) -> torch.Tensor:
    """``phi_q (phi_k^T v) / (phi_q phi_k^T 1)`` by groups of rows (Eq. 7).

    Args:
        q: ``(..., N_q, d)``, in the accumulation dtype.
        k: ``(..., N_k, d)``.
        v: ``(..., N_k, Dv)``.
        key_mask: bool ``(..., N_k)``, True at padding, or None.
        features: the feature strategy: a ``ClosedForm`` of inputs flattened to ``(G, n, d)``, or a
            ``FeatureFn`` of inputs ``(..., n, d)``.
        width: ``m``, the feature width (for the group rule).
        eps: relative guard of the normalizer.

    Returns:
        ``(..., N_q, Dv)``.
    """
    lead = q.shape[:-2]
    size = math.prod(lead)
    if not isinstance(features, ClosedForm):
        features = flattened(features, lead)
    q, k, v = (x.reshape(size, *x.shape[-2:]) for x in (q, k, v))
    mask = None if key_mask is None else key_mask.reshape(size, key_mask.shape[-1])
    key_rows = group_rows(k.shape[-2], k.shape[-1], width, batch=size)
    k_parts, v_parts = k.split(key_rows, 1), v.split(key_rows, 1)
    masks = row_groups(mask, key_rows, len(k_parts))
    sums = [_key_group(features, *part) for part in zip(k_parts, v_parts, masks, strict=True)]
    tops = torch.stack([top for _, _, top in sums])  # (groups, G, 1, m)
    reference = finite_or_zero(tops.amax(dim=0))
    decay = torch.exp(tops - reference)  # 0 for a column whose keys in a group are all padding
    state = (torch.stack([s for s, _, _ in sums]) * decay.mT).sum(dim=0)  # (G, m, Dv + 1)
    magnitude = None
    if sums[0][1] is not None:
        magnitude = (torch.stack([mag for _, mag, _ in sums]) * decay).sum(dim=0)  # type: ignore[misc]
    query_rows = group_rows(q.shape[-2], q.shape[-1], width, batch=size)
    outs = [_query_group(features, part, state, magnitude, reference, eps) for part in q.split(query_rows, 1)]
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
    return out.reshape(*lead, *out.shape[-2:])
