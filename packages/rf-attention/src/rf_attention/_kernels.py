"""Memory-lean random-feature attention: features computed chunk by chunk and recomputed in the backward pass.

Autograd keeps only ``q, k, v``, the ``m x Dv`` key-value sums (causal: one per chunk) and one number per
query; the ``N x m`` feature tensors live one chunk at a time, in the forward pass and again in the
backward pass, where their gradients are pushed through the feature map with ``torch.autograd.grad``.
The gradients are those of the plain formula ``phi_q (phi_k^T v) / (phi_q phi_k^T 1)`` of the same
features (the stabilizers are constants that cancel exactly, so they are detached).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

#: ``features(x, is_query) -> (log_features, multiplier)`` as ``FeatureMap.weighted_log_features``.
FeatureFn = Callable[[torch.Tensor, bool], tuple[torch.Tensor, torch.Tensor | None]]


def guarded_denominator(
    den: torch.Tensor, bound: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The normalizer ``D`` made safe to divide by, and where it was changed.

    Positive features (``bound`` None): only ``D == 0`` changes (to 1; no key is seen, the numerator is 0).
    Signed features: ``|D| <= eps * bound`` with ``bound = |phi_q| . sum_j |phi_k_j| >= |D|`` becomes
    ``sign(D) eps bound`` (1 where ``bound == 0``): a relative guard, blind to the features' overall scale.

    Args:
        den: ``(..., N, 1)``.
        bound: ``(..., N, 1)`` or None.
        eps: relative size of the guard.
    """
    if bound is None:
        guarded = den == 0
        return torch.where(guarded, torch.ones_like(den), den), guarded
    floor = eps * bound
    guarded = den.abs() <= floor
    sign = torch.where(den < 0, -1.0, 1.0).to(den.dtype)
    safe = torch.where(floor > 0, sign * floor, torch.ones_like(floor))
    return torch.where(guarded, safe, den), guarded


def _finite_or_zero(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def _decay(previous: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """``exp(previous - reference)``, 0 where ``previous`` is ``-inf`` (an empty state)."""
    finite = torch.isfinite(previous)
    return torch.where(finite, torch.exp(torch.where(finite, previous, 0.0) - reference), 0.0)


def _exp(log_x: torch.Tensor, mult: torch.Tensor | None) -> torch.Tensor:
    features = torch.exp(log_x)
    return features if mult is None else features * mult


def _chunks(n: int, size: int) -> list[slice]:
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def _param_grads(
    outputs: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    inputs: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor],
    totals: list[torch.Tensor | None],
) -> tuple[torch.Tensor | None, ...]:
    """Backpropagate ``grads`` from recomputed features to ``inputs`` and ``params`` (added to ``totals``)."""
    wanted = [*inputs, *params]
    needed = [t for t in wanted if t.requires_grad]
    found = iter(torch.autograd.grad(outputs, needed, grads, allow_unused=True)) if needed else iter(())
    result = [next(found) if t.requires_grad else None for t in wanted]
    for i, g in enumerate(result[len(inputs) :]):
        if g is not None:
            totals[i] = g if totals[i] is None else totals[i] + g
    return tuple(result[: len(inputs)])


def _leaf(x: torch.Tensor, needs_grad: bool) -> torch.Tensor:
    return x.detach().requires_grad_(needs_grad)


class NonCausalRFAttention(torch.autograd.Function):
    """``phi_q (phi_k^T v) / (phi_q phi_k^T 1)`` with features built in chunks of ``chunk_size`` rows.

    Stabilization that cannot lose the scale: keys are divided per feature column ``l`` by
    ``exp(M_l)``, ``M_l = max_j log phi_k[j, l]`` (kept by an online maximum over key chunks, rescaling
    the ``m x Dv`` sums as it grows), ``exp(M_l)`` moves to the query side, and each query row is divided
    by its largest entry. With positive features every normalizer is then at least 1 (or 0 for a row
    whose keys are all padding), whatever the logits.

    ``apply(q, k, v, key_mask, features, chunk_size, eps, *params)``: ``q [B, H, N_q, d]``,
    ``k [B, H, N_k, d]``, ``v [B, H, N_k, Dv]``, ``key_mask`` bool ``[B, H, N_k]`` or None; ``params``
    are the feature map's trainable tensors (they receive gradients).
    """

    @staticmethod
    def forward(ctx, q, k, v, key_mask, features: FeatureFn, chunk_size: int, eps: float, *params):
        lead, m_cols = q.shape[:-2], None
        state = column_max = normalizer = abs_normalizer = None
        key_signed = False
        for part in _chunks(k.shape[-2], chunk_size):
            log_k, mult_k = features(k[..., part, :], False)
            if key_mask is not None:
                log_k = log_k.masked_fill(key_mask[..., part, None], -math.inf)
            top = log_k.amax(dim=-2, keepdim=True)
            if state is None:
                m_cols = (mult_k if mult_k is not None else log_k).shape[-1]
                key_signed = mult_k is not None
                state = v.new_zeros(*lead, m_cols, v.shape[-1])
                normalizer = v.new_zeros(*lead, 1, m_cols)
                abs_normalizer = v.new_zeros(*lead, 1, m_cols) if key_signed else None
                column_max = torch.full_like(top, -math.inf)
            new_max = torch.maximum(column_max, top)
            reference = _finite_or_zero(new_max)
            decay = _decay(column_max, reference)
            phi_k = _exp(log_k - reference, mult_k)
            state = state * decay.mT + phi_k.mT @ v[..., part, :]
            plain = phi_k.sum(dim=-2, keepdim=True)
            normalizer = normalizer * decay + plain
            if key_signed:
                abs_normalizer = abs_normalizer * decay + phi_k.abs().sum(dim=-2, keepdim=True)
            column_max = new_max
        reference = _finite_or_zero(column_max)
        out = v.new_empty(*q.shape[:-1], v.shape[-1])
        den = v.new_empty(*q.shape[:-1], 1)
        guarded = torch.empty(*q.shape[:-1], 1, dtype=torch.bool, device=q.device)
        for part in _chunks(q.shape[-2], chunk_size):
            phi_q, query_signed = _query_features(features, q[..., part, :], reference)
            bound = None
            if key_signed or query_signed:
                bound = phi_q.abs() @ (abs_normalizer if key_signed else normalizer).mT
            den[..., part, :], guarded[..., part, :] = guarded_denominator(phi_q @ normalizer.mT, bound, eps)
            out[..., part, :] = (phi_q @ state) / den[..., part, :]
        ctx.save_for_backward(q, k, v, state, normalizer, reference, den, guarded, *params)
        ctx.key_mask, ctx.features, ctx.chunk_size = key_mask, features, chunk_size
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, state, normalizer, reference, den, guarded, *params = ctx.saved_tensors
        features, chunk_size, key_mask = ctx.features, ctx.chunk_size, ctx.key_mask
        totals: list[torch.Tensor | None] = [None] * len(params)
        grad_q = torch.zeros_like(q) if ctx.needs_input_grad[0] else None
        grad_k = torch.zeros_like(k) if ctx.needs_input_grad[1] else None
        grad_v = torch.zeros_like(v) if ctx.needs_input_grad[2] else None
        grad_state, grad_normalizer = torch.zeros_like(state), torch.zeros_like(normalizer)
        for part in _chunks(q.shape[-2], chunk_size):
            q_part = _leaf(q[..., part, :], grad_q is not None)
            with torch.enable_grad():
                phi_q, _ = _query_features(features, q_part, reference)
            values = phi_q.detach()
            g = grad_out[..., part, :] / den[..., part, :]
            out = (values @ state) / den[..., part, :]
            r = -(g * out).sum(-1, keepdim=True)
            r = r.masked_fill(guarded[..., part, :], 0.0)
            grad_state += values.mT @ g
            grad_normalizer += (values * r).sum(dim=-2, keepdim=True)
            (dq,) = _param_grads([phi_q], [g @ state.mT + r * normalizer], [q_part], params, totals)
            if grad_q is not None:
                grad_q[..., part, :] = dq
        for part in _chunks(k.shape[-2], chunk_size):
            k_part = _leaf(k[..., part, :], grad_k is not None)
            with torch.enable_grad():
                log_k, mult_k = features(k_part, False)
                if key_mask is not None:
                    log_k = log_k.masked_fill(key_mask[..., part, None], -math.inf)
                phi_k = _exp(log_k - reference, mult_k)
            v_part = v[..., part, :]
            if grad_v is not None:
                grad_v[..., part, :] = phi_k.detach() @ grad_state
            grad_phi_k = v_part @ grad_state.mT + grad_normalizer
            (dk,) = _param_grads([phi_k], [grad_phi_k], [k_part], params, totals)
            if grad_k is not None:
                grad_k[..., part, :] = dk
        return grad_q, grad_k, grad_v, None, None, None, None, *totals


def _query_features(
    features: FeatureFn, q: torch.Tensor, reference: torch.Tensor
) -> tuple[torch.Tensor, bool]:
    """Query features times the keys' column maxima ``exp(M)``, each row divided by its largest entry."""
    log_q, mult_q = features(q, True)
    log_q = log_q + reference
    log_q = log_q - log_q.amax(dim=-1, keepdim=True).detach()
    return _exp(log_q, mult_q), mult_q is not None


def _row_stabilized(
    features: FeatureFn, x: torch.Tensor, is_query: bool, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Features ``(n, m)``, each row divided by ``exp`` of its largest log-feature.

    Also returns that log-scale ``(n,)`` (``-inf`` at padding, whose features are 0) and whether the
    features have signs.
    """
    log_x, mult_x = features(x, is_query)
    top = log_x.amax(dim=-1, keepdim=True).detach()
    if mask is not None:
        top = top.masked_fill(mask[..., None], -math.inf)
    phi = _exp(log_x - _finite_or_zero(top), mult_x)
    if mask is not None:
        phi = phi.masked_fill(mask[..., None], 0.0)
    return phi, top.squeeze(-1), mult_x is not None


class CausalRFAttention(torch.autograd.Function):
    """Causal ``sum_{j<=i} phi_q_i . phi_k_j v_j / sum_{j<=i} phi_q_i . phi_k_j`` by chunked prefix sums.

    Each key ``j`` is divided by ``exp(c_j)`` (its largest log-feature), each query ``i`` uses the reference
    ``R_i = max_{j <= i} c_j``: within a chunk an explicit masked ``chunk x chunk`` product weighted by
    ``exp(c_j - R_i) <= 1``, across chunks the ``m x Dv`` state rescaled by ``exp(R_prev - R_i) <= 1``.
    The state entering each chunk (``m x Dv``) is kept for the backward pass, which runs the chunks in
    reverse carrying the state's gradient.

    ``apply(q, k, v, key_mask, features, chunk_size, eps, *params)`` as :class:`NonCausalRFAttention`
    with ``N_q == N_k``.
    """

    @staticmethod
    def forward(ctx, q, k, v, key_mask, features: FeatureFn, chunk_size: int, eps: float, *params):
        lead, n = q.shape[:-2], q.shape[-2]
        previous = q.new_full((*lead, 1), -math.inf)
        state = normalizer = abs_normalizer = None
        states, normalizers, previouses = [], [], []
        out = v.new_empty(*q.shape[:-1], v.shape[-1])
        den = v.new_empty(*q.shape[:-1], 1)
        guarded = torch.empty(*q.shape[:-1], 1, dtype=torch.bool, device=q.device)
        for part in _chunks(n, chunk_size):
            mask = None if key_mask is None else key_mask[..., part]
            phi_q, _, query_signed = _row_stabilized(features, q[..., part, :], True, None)
            phi_k, scale, key_signed = _row_stabilized(features, k[..., part, :], False, mask)
            if state is None:
                state = v.new_zeros(*lead, phi_k.shape[-1], v.shape[-1])
                normalizer = v.new_zeros(*lead, 1, phi_k.shape[-1])
                abs_normalizer = torch.zeros_like(normalizer) if key_signed else None
            states.append(state)
            normalizers.append(normalizer)
            previouses.append(previous)
            weights, carry, decay, key_weight, end = _causal_weights(scale, previous)
            scores = (phi_q @ phi_k.mT) * weights
            num = carry * (phi_q @ state) + scores @ v[..., part, :]
            plain_den = carry * (phi_q @ normalizer.mT) + scores.sum(-1, keepdim=True)
            bound = None
            if key_signed or query_signed:
                abs_q = phi_q.abs()
                past = abs_normalizer if key_signed else normalizer
                bound = carry * (abs_q @ past.mT) + ((abs_q @ phi_k.abs().mT) * weights).sum(-1, keepdim=True)
            den[..., part, :], guarded[..., part, :] = guarded_denominator(plain_den, bound, eps)
            out[..., part, :] = num / den[..., part, :]
            weighted_k = phi_k * key_weight
            state = state * decay.unsqueeze(-1) + weighted_k.mT @ v[..., part, :]
            normalizer = normalizer * decay.unsqueeze(-1) + weighted_k.sum(dim=-2, keepdim=True)
            if key_signed:
                abs_normalizer = abs_normalizer * decay.unsqueeze(-1) + (
                    weighted_k.abs().sum(dim=-2, keepdim=True)
                )
            previous = end
        ctx.save_for_backward(
            q,
            k,
            v,
            den,
            guarded,
            torch.stack(states),
            torch.stack(normalizers),
            torch.stack(previouses),
            *params,
        )
        ctx.key_mask, ctx.features, ctx.chunk_size = key_mask, features, chunk_size
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, den, guarded, states, normalizers, previouses, *params = ctx.saved_tensors
        features, chunk_size, key_mask = ctx.features, ctx.chunk_size, ctx.key_mask
        totals: list[torch.Tensor | None] = [None] * len(params)
        grad_q = torch.zeros_like(q) if ctx.needs_input_grad[0] else None
        grad_k = torch.zeros_like(k) if ctx.needs_input_grad[1] else None
        grad_v = torch.zeros_like(v) if ctx.needs_input_grad[2] else None
        grad_state, grad_normalizer = torch.zeros_like(states[0]), torch.zeros_like(normalizers[0])
        parts = _chunks(q.shape[-2], chunk_size)
        for index in reversed(range(len(parts))):
            part = parts[index]
            state, normalizer, previous = states[index], normalizers[index], previouses[index]
            mask = None if key_mask is None else key_mask[..., part]
            q_part = _leaf(q[..., part, :], grad_q is not None)
            k_part = _leaf(k[..., part, :], grad_k is not None)
            with torch.enable_grad():
                phi_q_graph, _, _ = _row_stabilized(features, q_part, True, None)
                phi_k_graph, scale, _ = _row_stabilized(features, k_part, False, mask)
            phi_q, phi_k, v_part = phi_q_graph.detach(), phi_k_graph.detach(), v[..., part, :]
            weights, carry, decay, key_weight, _ = _causal_weights(scale, previous)
            scores = (phi_q @ phi_k.mT) * weights
            d = den[..., part, :]
            out = (carry * (phi_q @ state) + scores @ v_part) / d
            g = grad_out[..., part, :] / d
            r = (-(g * out).sum(-1, keepdim=True)).masked_fill(guarded[..., part, :], 0.0)
            grad_scores = weights * (g @ v_part.mT + r)
            grad_phi_q = carry * (g @ state.mT + r * normalizer) + grad_scores @ phi_k
            grad_phi_k = grad_scores.mT @ phi_q + key_weight * (v_part @ grad_state.mT + grad_normalizer)
            if grad_v is not None:
                grad_v[..., part, :] = scores.mT @ g + (phi_k * key_weight) @ grad_state
            carried = carry * phi_q
            grad_state = grad_state * decay.unsqueeze(-1) + carried.mT @ g
            grad_normalizer = grad_normalizer * decay.unsqueeze(-1) + (carried * r).sum(dim=-2, keepdim=True)
            dq, dk = _param_grads(
                [phi_q_graph, phi_k_graph], [grad_phi_q, grad_phi_k], [q_part, k_part], params, totals
            )
            if grad_q is not None:
                grad_q[..., part, :] = dq
            if grad_k is not None:
                grad_k[..., part, :] = dk
        return grad_q, grad_k, grad_v, None, None, None, None, *totals


def _causal_weights(
    scale: torch.Tensor, previous: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The constants of one causal chunk from the key log-scales ``c (..., n)`` and ``R_prev (..., 1)``.

    Returns the masked intra-chunk weights ``exp(c_j - R_i)`` ``(..., n, n)``, the carry
    ``exp(R_prev - R_i)`` ``(..., n, 1)``, the state decay ``exp(R_prev - R_end)`` ``(..., 1)``, the
    key weights ``exp(c_j - R_end)`` ``(..., n, 1)`` and ``R_end (..., 1)``.
    """
    reference = torch.maximum(torch.cummax(scale, dim=-1).values, previous)
    safe = _finite_or_zero(reference)
    n = scale.shape[-1]
    lower = torch.ones(n, n, dtype=torch.bool, device=scale.device).tril()
    weights = torch.exp(scale.unsqueeze(-2) - safe.unsqueeze(-1)).masked_fill(~lower, 0.0)
    end = reference[..., -1:]
    safe_end = _finite_or_zero(end)
    carry = _decay(previous, safe).unsqueeze(-1)
    decay = _decay(previous, safe_end)
    key_weight = torch.exp(scale - safe_end).unsqueeze(-1)
    return weights, carry, decay, key_weight, end
