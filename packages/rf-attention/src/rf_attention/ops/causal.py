"""The chunked causal kernel: chunks of positions processed at once, a state carried between groups.

A group is cut into chunks of ``chunk`` positions, all processed at once: per-chunk key sums by one
batched matmul, the state entering every chunk by a prefix over the chunks, the intra-chunk masked products
by batched ``chunk x chunk`` matmuls. The state leaving a group enters the next.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from rf_attention.ops.common import (
    CAUSAL_GROUP_FEATURES_PER_QUERY_ELEMENT,
    FeatureFn,
    Gradients,
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
    flat_sides,
    row_stabilized_features,
)
from rf_features import ExponentialForm


def weighted_key_sums(
    phi_k: torch.Tensor, key_log_scale: torch.Tensor, v_ones: torch.Tensor, reference: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sum_j exp(c_j - R) phi_k_j^T [v_j, 1]`` ``(..., m, Dv + 1)`` and ``sum_j exp(c_j - R) |phi_k_j|``.

    ``phi_k (..., n, m)``, ``key_log_scale`` ``c (..., n)`` (``-inf`` at padding),
    ``v_ones (..., n, Dv + 1)``, ``reference`` ``R (...)``, finite and at least every ``c_j``.
    """
    weighted = phi_k * torch.exp(key_log_scale - reference.unsqueeze(-1)).unsqueeze(-1)
    return weighted.mT @ v_ones, weighted.abs().sum(dim=-2)


def causal_block(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    key_log_scale: torch.Tensor,
    v: torch.Tensor,
    state: torch.Tensor | None,
    magnitude: torch.Tensor | None,
    reference: torch.Tensor | None,
    *,
    chunk: int,
    eps: float,
    signed: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    r"""Causal attention of ``n`` positions continuing a state, all chunks at once (chunkwise-parallel Eq. 7).

    Key ``j``'s true features are $\phi_{k_j} e^{c_j}$; query $i$ uses the reference
    $R_i = \max(R_0, \max_{j \le i} c_j)$ (past keys only). With $E_t$ the reference at the end of chunk $t$
    ($E_{-1} = R_0$): chunk $t$'s key sums $S_t = \sum_{j \in t} e^{c_j - E_t} \phi_{k_j}^\top [v_j, 1]$
    (one batched matmul), the state entering chunk $t$,
    $P_t = e^{R_0 - E_{t-1}} S_0 + \sum_{u < t} e^{E_u - E_{t-1}} S_u$ (one ``(T + 1) x T`` decay matrix
    times the stacked $S_u$: a prefix sum whose weights are at most 1), and query $i$ of chunk $t$ gets
    $e^{E_{t-1} - R_i} \phi_{q_i} P_t
    + \sum_{j \in t, j \le i} e^{c_j - R_i} \phi_{q_i} \phi_{k_j}^\top [v_j, 1]$.

    Args:
        phi_q: ``(..., n, m)``, rows stabilized by their own constants.
        phi_k: ``(..., n, m)``, rows divided by ``exp(key_log_scale)``; 0 at padding.
        key_log_scale: ``(..., n)``, detached, ``-inf`` at padding.
        v: ``(..., n, Dv)``.
        state: ``(..., m, Dv + 1)`` sums ``[numerator, normalizer]`` of the earlier keys relative to
            ``reference``, or None (no earlier key).
        magnitude: ``(..., m)`` sums of ``|phi_k|`` likewise, or None (then computed only if ``signed``).
        reference: ``(...)`` ``R_0`` (``-inf``: no earlier key), or None.
        chunk: positions per chunk.
        eps: relative guard of the normalizer.
        signed: the features have signs (the guard then needs ``|phi_q| . sum |phi_k|``).

    Returns:
        ``out (..., n, Dv)``, the state, magnitude (None if neither given nor ``signed``) and reference
        after the ``n`` positions.
    """
    lead, n, m = phi_q.shape[:-2], phi_q.shape[-2], phi_q.shape[-1]
    size = math.prod(lead)
    ch = chunked_products(
        phi_q.reshape(size, n, m),
        phi_k.reshape(size, n, m),
        key_log_scale.reshape(size, n),
        v.reshape(size, n, v.shape[-1]),
        None if state is None else state.reshape(size, m, -1),
        None if magnitude is None else magnitude.reshape(size, m),
        None if reference is None else reference.reshape(size),
        chunk,
        signed,
    )
    assert ch.y is not None, "asked for"
    den, _ = guarded_denominator(ch.y[..., -1:], ch.bound, eps)
    out = (ch.y[..., :-1] / den).view(size, -1, v.shape[-1])[:, :n].reshape(*lead, n, v.shape[-1])
    final_magnitude = None if ch.magnitudes is None else ch.magnitudes[:, -1].reshape(*lead, m)
    final_state = ch.states[:, -1].reshape(*lead, m, -1)
    return out, final_state, final_magnitude, ch.entering[:, -1].reshape(lead)


class Chunked(NamedTuple):
    """The chunk-parallel intermediates of a causal block: ``g`` sequences of ``t`` chunks of ``c`` positions.

    ``w = Dv + 1``; per-chunk tensors are laid out ``(g t, c, .)`` for batched matmuls.
    """

    pq: torch.Tensor  # (g t, c, m)
    pk: torch.Tensor  # (g t, c, m)
    pv: torch.Tensor  # (g t, c, w): [v, 1]
    weighted_keys: torch.Tensor  # (g t, c, m): pk * exp(c_j - E_t)
    key_weights: torch.Tensor  # (g t, c, 1): exp(c_j - E_t)
    weights: torch.Tensor  # (g t, c, c): exp(c_j - R_i) for j <= i, else 0
    carry: torch.Tensor  # (g t, c, 1): exp(E_{t-1} - R_i)
    decay: torch.Tensor  # (g, t + 1, t): prefix weights over chunks
    carried: torch.Tensor  # (g, t + 1): weight of the entering state
    states: torch.Tensor  # (g, t + 1, m w): state entering each chunk, then the one after the block
    entering_states: torch.Tensor  # (g t, m, w): the state entering each chunk
    magnitudes: torch.Tensor | None  # (g, t + 1, m)
    entering: torch.Tensor  # (g, t + 1): reference entering each chunk, then the final one
    scores: torch.Tensor  # (g t, c, c): weighted intra-chunk products
    y: torch.Tensor | None  # (g t, c, w): numerators and normalizers (None: not asked for)
    bound: torch.Tensor | None  # (g t, c, 1): |phi_q| . sum |phi_k| (signed features)


def chunked_products(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    key_log_scale: torch.Tensor,
    v: torch.Tensor,
    state: torch.Tensor | None,
    magnitude: torch.Tensor | None,
    reference: torch.Tensor | None,
    chunk: int,
    signed: bool,
    outputs: bool = True,
) -> Chunked:
    """All [`causal_block`][rf_attention.ops.causal.causal_block] computes before the normalizer's guard.

    Inputs with one leading dimension: ``phi_q, phi_k (g, n, m)``, ``key_log_scale (g, n)``, ``v (g, n, Dv)``,
    ``state (g, m, w)``, ``magnitude (g, m)``, ``reference (g,)``. ``outputs=False`` leaves out ``y`` and
    the bound (a backward pass needs only the intermediates).
    """
    g, n, m = phi_q.shape
    c = min(chunk, n)
    t = -(-n // c)
    pad = t * c - n
    v_ones = with_ones(v)
    if pad:
        phi_q, phi_k, v_ones = (F.pad(x, (0, 0, 0, pad)) for x in (phi_q, phi_k, v_ones))
        key_log_scale = F.pad(key_log_scale, (0, pad), value=-math.inf)
    w = v_ones.shape[-1]
    if reference is None:
        reference = phi_q.new_full((g,), -math.inf)
    # references: R_i per position, E_t per chunk end, and the one entering each chunk (and the final one)
    refs = torch.maximum(torch.cummax(key_log_scale, dim=-1).values, reference.unsqueeze(-1))
    safe_refs = finite_or_zero(refs).view(g * t, c)
    ends = refs.view(g, t, c)[..., -1]
    entering = torch.cat((reference.unsqueeze(-1), ends), dim=-1)  # (g, t + 1)
    safe_entering = finite_or_zero(entering)
    pq, pk, pv = phi_q.view(g * t, c, m), phi_k.view(g * t, c, m), v_ones.view(g * t, c, w)
    scales = key_log_scale.view(g * t, c)
    # per-chunk key sums relative to the chunk's end reference
    key_weights = torch.exp(scales - finite_or_zero(ends).view(g * t, 1)).unsqueeze(-1)
    weighted = pk * key_weights
    chunk_sums = torch.bmm(weighted.mT, pv).view(g, t, m * w)
    # prefix over chunks: row r (0..t) is the state entering chunk r (r = t: after the block)
    # only u < r counts (tril); there E_u <= E_{r-1}, elsewhere the exponent is clamped (then zeroed)
    decay = (ends.unsqueeze(-2) - safe_entering.unsqueeze(-1)).clamp_max(0).exp().tril(-1)
    carried = torch.exp(reference.unsqueeze(-1) - safe_entering)  # (g, t + 1), 0 for an empty state
    if state is None:
        states = torch.bmm(decay, chunk_sums)
    else:
        states = torch.baddbmm(carried.unsqueeze(-1) * state.reshape(g, 1, m * w), decay, chunk_sums)
    magnitudes = None
    if signed or magnitude is not None:
        magnitudes = torch.bmm(decay, weighted.abs().sum(dim=-2).view(g, t, m))
        if magnitude is not None:
            magnitudes = magnitudes + carried.unsqueeze(-1) * magnitude.unsqueeze(-2)
    # queries: the state entering their chunk, weighed exp(E_{t-1} - R_i), and the keys j <= i of the chunk
    carry = torch.exp(entering[:, :-1].reshape(g * t, 1) - safe_refs).unsqueeze(-1)  # (g t, c, 1)
    weights = (scales.unsqueeze(-2) - safe_refs.unsqueeze(-1)).clamp_max(0).exp().tril()  # j <= i
    scores = torch.bmm(pq, pk.mT).mul_(weights)
    entering_states = states[:, :-1].reshape(g * t, m, w)
    y = bound = None
    if outputs:
        y = torch.bmm(pq, entering_states).mul_(carry).baddbmm_(scores, pv)
    if outputs and signed:
        assert magnitudes is not None, "tracked with the states"
        abs_q = pq.detach().abs()
        inside = (torch.bmm(abs_q, pk.detach().abs().mT) * weights).sum(dim=-1, keepdim=True)
        entering_magnitudes = magnitudes[:, :-1].detach().reshape(g * t, m, 1)
        bound = torch.addcmul(inside, carry, torch.bmm(abs_q, entering_magnitudes))
    return Chunked(
        pq, pk, pv, weighted, key_weights, weights, carry, decay, carried, states, entering_states,
        magnitudes, entering, scores, y, bound,
    )  # fmt: skip


def _causal_group(
    features: FeatureFn,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    state: torch.Tensor | None,
    magnitude: torch.Tensor | None,
    reference: torch.Tensor | None,
    chunk: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Features of one group of positions and its ``causal_block``."""
    phi_q, _, query_signed = row_stabilized_features(features, q, True, None)
    phi_k, scale, key_signed = row_stabilized_features(features, k, False, mask)
    signed = query_signed or key_signed
    return causal_block(
        phi_q, phi_k, scale, v, state, magnitude, reference, chunk=chunk, eps=eps, signed=signed
    )


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    features: FeatureFn,
    *,
    width: int,
    chunk: int,
    eps: float,
) -> torch.Tensor:
    """Causal ``sum_{j<=i} phi_q_i . phi_k_j v_j / sum_{j<=i} phi_q_i . phi_k_j`` by groups of chunks.

    Each group is one [`causal_block`][rf_attention.ops.causal.causal_block] (all its chunks at once); the
    state leaving a group enters the next.

    Args:
        q: ``(..., N, d)``.
        k: ``(..., N, d)``.
        v: ``(..., N, Dv)``.
        key_mask: bool ``(..., N)``, True at padding, or None.
        features: the feature map of queries and keys.
        width: ``m``, the feature width (for the group rule).
        chunk: positions per chunk.
        eps: relative guard of the normalizer.
    """
    n = q.shape[-2]
    rows = group_rows(n, q.shape[-1], width, multiple=min(chunk, n))
    state: torch.Tensor | None = None
    magnitude: torch.Tensor | None = None
    reference: torch.Tensor | None = None
    outs = []
    for part in row_slices(n, rows):
        out, state, magnitude, reference = recomputed(
            _causal_group,
            features,
            q[..., part, :],
            k[..., part, :],
            v[..., part, :],
            mask_part(key_mask, part),
            state,
            magnitude,
            reference,
            chunk,
            eps,
        )
        outs.append(out)
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)


def _chunked_vjp(
    ch: Chunked, grad_y: torch.Tensor, grad_state_out: torch.Tensor | None, need_state: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradients of ``phi_q``, ``phi_k``, ``[v, 1]`` ``(g t, c, .)`` and of the entering state.

    From those of ``y`` ``(g t, c, w)`` and of the state leaving the block (None: nothing used it).
    ``y = carry * (pq @ P_t) + scores @ pv``, ``scores = (pq @ pk^T) * weights``, ``P = decay @ S +
    carried * P_0``, ``S_t = (pk * e^{c - E_t})^T @ pv``: the reference weights are constants.
    """
    g, m, w = ch.decay.shape[0], ch.pq.shape[-1], ch.pv.shape[-1]
    carried_grad = ch.carry * grad_y
    grad_scores = torch.bmm(grad_y, ch.pv.mT).mul_(ch.weights)
    grad_pq = torch.bmm(grad_scores, ch.pk).baddbmm_(carried_grad, ch.entering_states.mT)
    grad_states = torch.bmm(ch.pq.mT, carried_grad).view(g, -1, m * w)  # (g, t, m w)
    decay, carried = ch.decay[:, :-1], ch.carried[:, :-1]
    if grad_state_out is not None:
        grad_states = torch.cat((grad_states, grad_state_out.view(g, 1, m * w)), dim=-2)
        decay, carried = ch.decay, ch.carried
    grad_sums = torch.bmm(decay.mT, grad_states).view(-1, m, w)  # (g t, m, w)
    grad_state_in = None
    if need_state:
        grad_state_in = torch.bmm(carried.unsqueeze(-2), grad_states).view(g, m, w)
    grad_pk = torch.bmm(ch.pv, grad_sums.mT).mul_(ch.key_weights).baddbmm_(grad_scores.mT, ch.pq)
    grad_pv = torch.bmm(ch.scores.mT, grad_y).baddbmm_(ch.weighted_keys, grad_sums)
    return grad_pq, grad_pk, grad_pv, grad_state_in


class _Causal(torch.autograd.Function):
    """Causal attention with closed-form features, by groups of chunks.

    The backward pass recomputes each group's features and chunk products, last group first, and applies
    their hand-written VJPs. Saved: the inputs, the state and reference entering each group, the outputs
    and normalizers.
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
        rows: int,
        chunk: int,
        eps: float,
    ) -> torch.Tensor:
        qs = FeatureSide(query_projection, query_offset, query_sign, trigonometric)
        ks = FeatureSide(key_projection, key_offset, None, trigonometric)
        signed = trigonometric or query_sign is not None
        state: torch.Tensor | None = None
        magnitude: torch.Tensor | None = None
        reference: torch.Tensor | None = None
        states, references = [], []
        out = v.new_empty(v.shape)
        den = v.new_empty(*v.shape[:-1], 1)
        free = torch.empty(den.shape, dtype=torch.bool, device=den.device)
        parts = [x.split(rows, dim=1) for x in (q, k, v, out, den, free)]
        masks = row_groups(key_mask, rows, len(parts[0]))
        for q_part, k_part, v_part, out_part, den_part, free_part, mask in zip(*parts, masks, strict=True):
            if state is not None and reference is not None:
                states.append(state)
                references.append(reference)
            fq, _ = closed_form_features(q_part, qs, None, "row")
            fk, scale = closed_form_features(k_part, ks, mask, "row")
            ch = chunked_products(
                fq.phi, fk.phi, scale.squeeze(-1), v_part, state, magnitude, reference, chunk, signed
            )
            assert ch.y is not None, "asked for"
            den_y, guarded = guarded_denominator(ch.y[..., -1:], ch.bound, eps)
            size, n = fq.phi.shape[:2]
            out_part.copy_((ch.y[..., :-1] / den_y).view(size, -1, v.shape[-1])[:, :n])
            den_part.copy_(den_y.view(size, -1, 1)[:, :n])
            free_part.copy_(~guarded.view(size, -1, 1)[:, :n])
            state, reference = ch.states[:, -1], ch.entering[:, -1]
            magnitude = None if ch.magnitudes is None else ch.magnitudes[:, -1]
            del fq, fk, ch, den_y, guarded
        entering_states = torch.stack(states) if states else None
        entering_references = torch.stack(references) if references else None
        ctx.save_for_backward(
            q, k, v, key_mask, query_projection, query_offset, key_projection, key_offset, query_sign,
            entering_states, entering_references, out, den, free,
        )  # fmt: skip
        ctx.config = (trigonometric, rows, chunk)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (
            q, k, v, key_mask, query_projection, query_offset, key_projection, key_offset, query_sign,
            entering_states, entering_references, out, den, free,
        ) = ctx.saved_tensors  # fmt: skip
        trigonometric, rows, chunk = ctx.config
        qs = FeatureSide(query_projection, query_offset, query_sign, trigonometric)
        ks = FeatureSide(key_projection, key_offset, None, trigonometric)
        grads = Gradients(q, k, v, (rows, rows))
        grad_state: torch.Tensor | None = None
        parts = [x.split(rows, dim=1) for x in (q, k, v, out, den, free, grad_out)]
        masks = row_groups(key_mask, rows, len(parts[0]))
        for index in reversed(range(len(masks))):
            q_part, k_part, v_part, out_part, den_part, free_part, grad_part = (p[index] for p in parts)
            state = None if index == 0 else entering_states[index - 1]
            reference = None if index == 0 else entering_references[index - 1]
            fq, _ = closed_form_features(q_part, qs, None, "row")
            fk, scale = closed_form_features(k_part, ks, masks[index], "row")
            ch = chunked_products(
                fq.phi, fk.phi, scale.squeeze(-1), v_part, state, None, reference, chunk, False, outputs=False
            )
            size, n, m = fq.phi.shape
            c = ch.pq.shape[-2]
            gy = guard_gradient(out_part, den_part, free_part.to(den.dtype), grad_part)
            if n % c:
                gy = F.pad(gy, (0, 0, 0, c - n % c))
            grad_pq, grad_pk, grad_pv, grad_state = _chunked_vjp(
                ch, gy.view(-1, c, gy.shape[-1]), grad_state, index > 0
            )
            grads.v_parts[index].copy_(grad_pv.view(size, -1, grad_pv.shape[-1])[:, :n, :-1])
            gx, gp, gb = closed_form_vjp(grad_pq.view(size, -1, m)[:, :n], q_part, fq, qs)
            grads.q_parts[index].copy_(gx)
            grads.side(0, gp, gb)
            gx, gp, gb = closed_form_vjp(grad_pk.view(size, -1, m)[:, :n], k_part, fk, ks)
            grads.k_parts[index].copy_(gx)
            grads.side(1, gp, gb)
            del fq, fk, ch, gy, grad_pq, grad_pk, grad_pv, gx
        return grads.result()


def closed_form_causal(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    query_form: ExponentialForm,
    key_form: ExponentialForm,
    *,
    chunk: int,
    eps: float,
) -> torch.Tensor:
    """Causal attention with closed-form features and hand-written backward passes.

    Args:
        q: ``(..., N, d)``, in the accumulation dtype.
        k: ``(..., N, d)``.
        v: ``(..., N, Dv)``.
        key_mask: bool ``(..., N)``, True at padding, or None.
        query_form: the queries' features (``rf_features.ExponentialForm``).
        key_form: the keys' features.
        chunk: positions per chunk.
        eps: relative guard of the normalizer.

    Returns:
        ``(..., N, Dv)``.
    """
    lead = q.shape[:-2]
    size = math.prod(lead)
    sides = flat_sides(query_form, key_form, lead, q.dtype)
    width = sides[1].shape[-1]
    flat = [x.reshape(size, *x.shape[-2:]) for x in (q, k, v)]
    mask = None if key_mask is None else key_mask.reshape(size, key_mask.shape[-1])
    n = q.shape[-2]
    per_element = CAUSAL_GROUP_FEATURES_PER_QUERY_ELEMENT
    group = group_rows(n, q.shape[-1], width, min(chunk, n), per_element, batch=size)
    out = _Causal.apply(*flat, mask, *sides, query_form.trigonometric, group, chunk, eps)
    return out.reshape(*lead, *out.shape[-2:])
