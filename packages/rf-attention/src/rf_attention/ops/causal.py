r"""The chunked causal kernel: chunks of positions at once, a log-depth scan for the state entering each.

A group of positions is cut into chunks of ``chunk`` positions, all processed at once: per-chunk key sums
by one batched matmul, the intra-chunk masked products by batched ``chunk x chunk`` matmuls, and the state
entering every chunk by [`chunk_prefix`][rf_attention.ops.causal.chunk_prefix], an inclusive scan over the
chunks' ``(state, stabilizer)`` pairs in ``ceil(log2(T + 1))`` steps (Hillis-Steele): no matmul and
``O(m Dv log T)`` elementwise work per chunk, where a ``(T + 1) x T`` decay-weighted prefix matmul costs
``O(T m Dv)`` matmul FLOPs per chunk (quadratic in N). Every factor of the scan is
$e^{E_u - E_r} \le 1$ with $E$ the running maximum of the keys' log-scales, which sees past keys only.

The state leaving a group enters the next; groups hold a bounded share of the sequence
([`group_rows`][rf_attention.ops.common.group_rows]), so memory stays linear in N with a small constant.
One loop, [`causal_attention`][rf_attention.ops.causal.causal_attention], takes the feature strategy: a
closed form runs each group as a ``torch.autograd.Function`` (hand-written VJPs, features recomputed in
the backward pass); any other ``FeatureFn`` runs each group under ``torch.utils.checkpoint``. It takes an
initial state and returns the final one (prefill continues from it).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from rf_attention.ops.common import (
    FeatureFn,
    causal_group_rows,
    finite_or_zero,
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
    row_stabilized_features,
)


class CausalState(NamedTuple):
    """What later positions need of the keys so far, relative to the running stabilizer ``R``.

    Attributes:
        sums: ``(..., m, Dv + 1)``: ``sum_j exp(c_j - R) phi_k_j^T [v_j, 1]`` (numerator, normalizer).
        magnitude: ``(..., m)``: ``sum_j exp(c_j - R) |phi_k_j|`` (signed features' guard), or None.
        reference: ``(...)``: ``R = max_j c_j``, ``-inf`` while no (non-padding) key has been seen.
    """

    sums: torch.Tensor
    magnitude: torch.Tensor | None
    reference: torch.Tensor


def chunk_prefix(x: torch.Tensor, log_ref: torch.Tensor, *, reverse: bool = False) -> torch.Tensor:
    r"""$y_r = \sum_{u \le r} e^{e_u - e_r} x_u$; ``reverse``: $y_u = \sum_{r \ge u} e^{e_u - e_r} x_r$.

    ``x (g, T, F)`` are terms relative to the references ``log_ref`` ``e (g, T, 1)``, non-decreasing along
    ``T`` (a running maximum; no ``inf``), so every factor is at most 1; $y_r$ is their prefix sum relative
    to $e_r$, and ``reverse`` is the transpose (the backward pass). ``ceil(log2 T)`` steps of one
    multiply-add each (Hillis-Steele): step ``s`` adds $e^{e_{r-s} - e_r} y_{r-s}$ to $y_r$.
    """
    y = x.clone()
    steps, t = 1, x.shape[1]
    while steps < t:
        weight = (log_ref[:, :-steps] - log_ref[:, steps:]).exp_()
        if reverse:
            y[:, :-steps].add_(weight * y[:, steps:])
        else:
            y[:, steps:].add_(weight * y[:, :-steps])
        steps *= 2
    return y


class _ChunkPrefix(torch.autograd.Function):
    """[`chunk_prefix`][rf_attention.ops.causal.chunk_prefix] with its transpose as the backward pass."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, log_ref: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(log_ref)
        return chunk_prefix(x, log_ref)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (log_ref,) = ctx.saved_tensors
        return chunk_prefix(grad, log_ref, reverse=True), None


def weighted_key_sums(
    phi_k: torch.Tensor, key_log_scale: torch.Tensor, v_ones: torch.Tensor, reference: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sum_j exp(c_j - R) phi_k_j^T [v_j, 1]`` ``(..., m, Dv + 1)`` and ``sum_j exp(c_j - R) |phi_k_j|``.

    ``phi_k (..., n, m)``, ``key_log_scale`` ``c (..., n)`` (``-inf`` at padding),
    ``v_ones (..., n, Dv + 1)``, ``reference`` ``R (...)``, finite and at least every ``c_j``.
    """
    weighted = phi_k * torch.exp(key_log_scale - reference.unsqueeze(-1)).unsqueeze(-1)
    return weighted.mT @ v_ones, weighted.abs().sum(dim=-2)


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
    log_ref: torch.Tensor  # (g, t + 1, 1): the scan's references (entering each chunk, then the final one)
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
    r"""All [`causal_block`][rf_attention.ops.causal.causal_block] computes before the normalizer's guard.

    Inputs with one leading dimension: ``phi_q, phi_k (g, n, m)``, ``key_log_scale (g, n)``, ``v (g, n, Dv)``,
    ``state (g, m, w)``, ``magnitude (g, m)``, ``reference (g,)``. ``outputs=False`` leaves out ``y`` and
    the bound (a backward pass needs only the intermediates). The scan runs over
    $[P_0, S_0, \dots, S_{t-1}]$ (the entering state, then the chunks' key sums).
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
    # the scan's references: -inf (no key yet, a zero state) as the lowest finite value keeps them ordered
    log_ref = torch.nan_to_num(entering, neginf=torch.finfo(entering.dtype).min).unsqueeze(-1)
    pq, pk, pv = phi_q.view(g * t, c, m), phi_k.view(g * t, c, m), v_ones.view(g * t, c, w)
    scales = key_log_scale.view(g * t, c)
    # per-chunk key sums relative to the chunk's end reference
    key_weights = torch.exp(scales - finite_or_zero(ends).view(g * t, 1)).unsqueeze(-1)
    weighted = pk * key_weights
    terms = [torch.bmm(weighted.mT, pv).view(g, t, m * w)]
    first = [pq.new_zeros(g, 1, m * w) if state is None else state.reshape(g, 1, m * w)]
    tracked = signed or magnitude is not None
    if tracked:
        terms.append(weighted.abs().sum(dim=-2).view(g, t, m))
        first.append(pq.new_zeros(g, 1, m) if magnitude is None else magnitude.view(g, 1, m))
    pairs = [torch.cat(pair, dim=1) for pair in zip(first, terms, strict=True)]
    scanned = _ChunkPrefix.apply(pairs[0] if len(pairs) == 1 else torch.cat(pairs, dim=-1), log_ref)
    states = scanned[..., : m * w] if tracked else scanned
    magnitudes = scanned[..., m * w :] if tracked else None
    # queries: the state entering their chunk, weighed exp(E_{t-1} - R_i), and the keys j <= i of the chunk
    carry = torch.exp(entering[:, :-1].reshape(g * t, 1) - safe_refs).unsqueeze(-1)  # (g t, c, 1)
    # exp(c_j - R_i) <= 1 for j <= i; tril_ zeroes j > i, whose exponent may be positive (even inf)
    weights = (scales.unsqueeze(-2) - safe_refs.unsqueeze(-1)).exp_().tril_()
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
        pq, pk, pv, weighted, key_weights, weights, carry, log_ref, states, entering_states, magnitudes,
        entering, scores, y, bound,
    )  # fmt: skip


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
    $P_t = e^{R_0 - E_{t-1}} P_0 + \sum_{u < t} e^{E_u - E_{t-1}} S_u$ (the scan
    [`chunk_prefix`][rf_attention.ops.causal.chunk_prefix], every factor at most 1), and query $i$ of chunk
    $t$ gets $e^{E_{t-1} - R_i} \phi_{q_i} P_t
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


def causal_group(
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
    """Features of one group of positions and its [`causal_block`][rf_attention.ops.causal.causal_block]."""
    phi_q, _, query_signed = row_stabilized_features(features, q, True, None)
    phi_k, scale, key_signed = row_stabilized_features(features, k, False, mask)
    signed = query_signed or key_signed
    return causal_block(
        phi_q, phi_k, scale, v, state, magnitude, reference, chunk=chunk, eps=eps, signed=signed
    )


def _chunked_vjp(
    ch: Chunked, grad_y: torch.Tensor, grad_state_out: torch.Tensor | None, need_state: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradients of ``phi_q``, ``phi_k``, ``[v, 1]`` ``(g t, c, .)`` and of the entering state.

    From those of ``y`` ``(g t, c, w)`` and of the state leaving the block (None: nothing used it).
    ``y = carry * (pq @ P_t) + scores @ pv``, ``scores = (pq @ pk^T) * weights``, ``P = scan([P_0, S])``,
    ``S_t = (pk * e^{c - E_t})^T @ pv``: the reference weights are constants, and the scan's transpose is
    the reverse scan.
    """
    g, m, w = ch.log_ref.shape[0], ch.pq.shape[-1], ch.pv.shape[-1]
    carried_grad = ch.carry * grad_y
    grad_scores = torch.bmm(grad_y, ch.pv.mT).mul_(ch.weights)
    grad_pq = torch.bmm(grad_scores, ch.pk).baddbmm_(carried_grad, ch.entering_states.mT)
    grad_states = torch.bmm(ch.pq.mT, carried_grad).view(g, -1, m * w)  # (g, t, m w)
    last = grad_states.new_zeros(g, 1, m * w) if grad_state_out is None else grad_state_out.view(g, 1, m * w)
    grad_terms = chunk_prefix(torch.cat((grad_states, last), dim=1), ch.log_ref, reverse=True)
    grad_sums = grad_terms[:, 1:].reshape(-1, m, w)  # (g t, m, w)
    grad_state_in = grad_terms[:, 0].view(g, m, w) if need_state else None
    grad_pk = torch.bmm(ch.pv, grad_sums.mT).mul_(ch.key_weights).baddbmm_(grad_scores.mT, ch.pq)
    grad_pv = torch.bmm(ch.scores.mT, grad_y).baddbmm_(ch.weighted_keys, grad_sums)
    return grad_pq, grad_pk, grad_pv, grad_state_in


class _ClosedCausal(torch.autograd.Function):
    """[`causal_group`][rf_attention.ops.causal.causal_group] of closed-form features, hand-written VJPs.

    Saved: the group's inputs, the state and reference entering it, its outputs and normalizers; the
    backward pass recomputes the features and chunk products.
    """

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        state: torch.Tensor | None,
        magnitude: torch.Tensor | None,
        reference: torch.Tensor | None,
        query_projection: torch.Tensor,
        query_square: torch.Tensor,
        query_offset: torch.Tensor,
        key_projection: torch.Tensor,
        key_square: torch.Tensor,
        key_offset: torch.Tensor,
        query_sign: torch.Tensor | None,
        wave_shift: torch.Tensor | None,
        chunk: int,
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
        ctx.set_materialize_grads(False)
        qs = FeatureSide(query_projection, query_square, query_offset, query_sign, wave_shift)
        ks = FeatureSide(key_projection, key_square, key_offset, None, wave_shift)
        fq, _ = closed_form_features(q, qs, None, "row")
        fk, scale = closed_form_features(k, ks, mask, "row")
        signed = qs.trigonometric or query_sign is not None
        ch = chunked_products(
            fq.phi, fk.phi, scale.squeeze(-1), v, state, magnitude, reference, chunk, signed
        )
        assert ch.y is not None, "asked for"
        den, guarded = guarded_denominator(ch.y[..., -1:], ch.bound, eps)
        size, n = q.shape[:2]
        out = (ch.y[..., :-1] / den).view(size, -1, v.shape[-1])[:, :n]
        den, free = den.view(size, -1, 1)[:, :n], ~guarded.view(size, -1, 1)[:, :n]
        ctx.save_for_backward(
            q, k, v, mask, state, reference, query_projection, query_square, query_offset, key_projection,
            key_square, key_offset, query_sign, wave_shift, out, den, free,
        )  # fmt: skip
        ctx.chunk = chunk
        # copies: a view would keep the group's scan alive as long as the state
        final_state = ch.states[:, -1].reshape(size, *ch.entering_states.shape[-2:]).clone()
        final_magnitude = None if ch.magnitudes is None else ch.magnitudes[:, -1].clone()
        final_reference = ch.entering[:, -1].clone()
        ctx.mark_non_differentiable(final_reference, *([] if final_magnitude is None else [final_magnitude]))
        return out, final_state, final_magnitude, final_reference

    @staticmethod
    def backward(
        ctx: Any, grad_out: torch.Tensor | None, grad_state: torch.Tensor | None, *_unused: Any
    ) -> tuple[torch.Tensor | None, ...]:
        (
            q, k, v, mask, state, reference, query_projection, query_square, query_offset, key_projection,
            key_square, key_offset, query_sign, wave_shift, out, den, free,
        ) = ctx.saved_tensors  # fmt: skip
        chunk = ctx.chunk
        qs = FeatureSide(query_projection, query_square, query_offset, query_sign, wave_shift)
        ks = FeatureSide(key_projection, key_square, key_offset, None, wave_shift)
        fq, _ = closed_form_features(q, qs, None, "row")
        fk, key_scale = closed_form_features(k, ks, mask, "row")
        ch = chunked_products(
            fq.phi, fk.phi, key_scale.squeeze(-1), v, state, None, reference, chunk, False, outputs=False
        )
        size, n, m = fq.phi.shape
        c = ch.pq.shape[-2]
        grad = torch.zeros_like(out) if grad_out is None else grad_out
        gy = guard_gradient(out, den, free.to(den.dtype), grad)
        if n % c:
            gy = F.pad(gy, (0, 0, 0, c - n % c))
        grad_pq, grad_pk, grad_pv, grad_state_in = _chunked_vjp(
            ch, gy.view(-1, c, gy.shape[-1]), grad_state, state is not None
        )
        del ch, gy  # the chunk products are freed before the features' VJPs allocate
        grad_v = grad_pv.view(size, -1, grad_pv.shape[-1])[:, :n, :-1]
        needs = ctx.needs_input_grad
        grad_q, *grad_query_side = closed_form_vjp(
            grad_pq.view(size, -1, m)[:, :n], q, fq, qs, parameters=any(needs[7:10])
        )
        grad_k, *grad_key_side = closed_form_vjp(
            grad_pk.view(size, -1, m)[:, :n], k, fk, ks, parameters=any(needs[10:13])
        )
        return (
            grad_q, grad_k, grad_v, None, grad_state_in, None, None, *grad_query_side, *grad_key_side,
            None, None, None, None,
        )  # fmt: skip


def _group(
    features: Features,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    state: CausalState | None,
    chunk: int,
    eps: float,
) -> tuple[torch.Tensor, CausalState]:
    carried = (None, None, None) if state is None else state
    if isinstance(features, ClosedForm):
        qs, ks = features.query, features.key
        out, *rest = _ClosedCausal.apply(
            q, k, v, mask, *carried, qs.projection, qs.square, qs.offset, ks.projection, ks.square,
            ks.offset, qs.sign, qs.wave_shift, chunk, eps,
        )  # fmt: skip
    else:
        out, *rest = recomputed(causal_group, features, q, k, v, mask, *carried, chunk, eps)
    return out, CausalState(*rest)


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    features: Features,
    *,
    width: int,
    chunk: int,
    eps: float,
    state: CausalState | None = None,
) -> tuple[torch.Tensor, CausalState]:
    """Causal ``sum_{j<=i} phi_q_i . phi_k_j v_j / sum_{j<=i} phi_q_i . phi_k_j`` by groups of chunks.

    Each group is one [`causal_block`][rf_attention.ops.causal.causal_block] (all its chunks at once); the
    state leaving a group enters the next.

    Args:
        q: ``(..., N, d)``, in the accumulation dtype.
        k: ``(..., N, d)``.
        v: ``(..., N, Dv)``.
        key_mask: bool ``(..., N)``, True at padding, or None.
        features: the feature strategy: a ``ClosedForm`` of inputs flattened to ``(G, n, d)``, or a
            ``FeatureFn`` of inputs ``(..., n, d)``.
        width: ``m``, the feature width (for the group rule).
        chunk: positions per chunk (the intra-chunk products are ``chunk x chunk``).
        eps: relative guard of the normalizer.
        state: the keys before these ``N`` positions (leading shape ``...``), or None (none).

    Returns:
        ``(..., N, Dv)`` and the state after the ``N`` positions (the same pass; gradients flow through it).
    """
    lead, (n, d) = q.shape[:-2], q.shape[-2:]
    size = math.prod(lead)
    if not isinstance(features, ClosedForm):
        features = flattened(features, lead)
    q, k, v = (x.reshape(size, *x.shape[-2:]) for x in (q, k, v))
    mask = None if key_mask is None else key_mask.reshape(size, n)
    carried = None
    if state is not None:
        magnitude = None if state.magnitude is None else state.magnitude.reshape(size, -1)
        carried = CausalState(
            state.sums.reshape(size, *state.sums.shape[-2:]), magnitude, state.reference.reshape(size)
        )
    rows = causal_group_rows(n, d, width, chunk, size)
    parts = [x.split(rows, dim=1) for x in (q, k, v)]
    outs = []
    for q_part, k_part, v_part, mask_part in zip(*parts, row_groups(mask, rows, len(parts[0])), strict=True):
        out, carried = _group(features, q_part, k_part, v_part, mask_part, carried, chunk, eps)
        outs.append(out)
    assert carried is not None, "q has at least one row"
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
    magnitude = None if carried.magnitude is None else carried.magnitude.reshape(*lead, -1)
    final = CausalState(
        carried.sums.reshape(*lead, *carried.sums.shape[-2:]), magnitude, carried.reference.reshape(lead)
    )
    return out.reshape(*lead, *out.shape[-2:]), final
