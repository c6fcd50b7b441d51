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
from typing import Any

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
            total = totals[i]
            totals[i] = g if total is None else total + g
    return tuple(result[: len(inputs)])


def _leaf(x: torch.Tensor, needs_grad: bool) -> torch.Tensor:
    return x.detach().requires_grad_(needs_grad)


def _with_ones(v: torch.Tensor) -> torch.Tensor:
    """``[v, 1]`` ``(..., n, Dv + 1)``: one product then gives numerator and normalizer together."""
    return torch.cat((v, v.new_ones(*v.shape[:-1], 1)), dim=-1)


def _split(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return y[..., :-1], y[..., -1:]


def _output_grads(
    grad_out: torch.Tensor, y: torch.Tensor, den: torch.Tensor, guarded: torch.Tensor
) -> torch.Tensor:
    """``[g, r]`` ``(..., n, Dv + 1)``: the gradient of ``out = num / D`` w.r.t. ``y = [num, D]``.

    ``g = dout / D``, ``r = -(dout . out) / D``; 0 where the guard replaced ``D`` (held constant there).
    """
    g = grad_out / den
    r = (-(g * (_split(y)[0] / den)).sum(-1, keepdim=True)).masked_fill(guarded, 0.0)
    return torch.cat((g, r), dim=-1)


class NonCausalRFAttention(torch.autograd.Function):
    """``phi_q (phi_k^T v) / (phi_q phi_k^T 1)`` with features built in chunks of ``chunk_size`` rows.

    One ``m x (Dv + 1)`` state ``phi_k^T [v, 1]`` holds numerator and normalizer sums. Stabilization that
    cannot lose the scale: keys are divided per feature column ``l`` by ``exp(M_l)``,
    ``M_l = max_j log phi_k[j, l]`` (an online maximum over key chunks, rescaling the state's rows as it
    grows), ``exp(M_l)`` moves to the query side, and each query row is divided by its largest entry.
    With positive features every normalizer is then at least 1 (0 for a row whose keys are all padding),
    whatever the logits.

    ``apply(q, k, v, key_mask, features, chunk_size, eps, *params)``: ``q [B, H, N_q, d]``,
    ``k [B, H, N_k, d]``, ``v [B, H, N_k, Dv]``, ``key_mask`` bool ``[B, H, N_k]`` or None; ``params``
    are the feature map's trainable tensors (they receive gradients).
    """

    @staticmethod
    def forward(
        ctx: Any,  # torch types the context of a custom Function as Any
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        key_mask: torch.Tensor | None,
        features: FeatureFn,
        chunk_size: int,
        eps: float,
        *params: torch.Tensor,
    ) -> torch.Tensor:
        state: torch.Tensor | None = None
        column_max: torch.Tensor | None = None
        abs_normalizer: torch.Tensor | None = None
        for part in _chunks(k.shape[-2], chunk_size):
            log_k, mult_k = features(k[..., part, :], False)
            if key_mask is not None:
                log_k = log_k.masked_fill(key_mask[..., part, None], -math.inf)
            top = log_k.amax(dim=-2, keepdim=True)
            if state is None or column_max is None:
                width = (mult_k if mult_k is not None else log_k).shape[-1]
                state = v.new_zeros(*q.shape[:-2], width, v.shape[-1] + 1)
                abs_normalizer = v.new_zeros(*q.shape[:-2], 1, width) if mult_k is not None else None
                column_max = torch.full_like(top, -math.inf)
            new_max = torch.maximum(column_max, top)
            reference = _finite_or_zero(new_max)
            decay = _decay(column_max, reference)
            phi_k = (log_k - reference).exp_()
            if mult_k is not None:
                phi_k = phi_k * mult_k
            state.mul_(decay.mT).add_(phi_k.mT @ _with_ones(v[..., part, :]))
            if abs_normalizer is not None:
                abs_normalizer = abs_normalizer * decay + phi_k.abs().sum(dim=-2, keepdim=True)
            column_max = new_max
        assert state is not None, "k has at least one row"
        assert column_max is not None, "k has at least one row"
        reference = _finite_or_zero(column_max)
        out = v.new_empty(*q.shape[:-1], v.shape[-1])
        den = v.new_empty(*q.shape[:-1], 1)
        guarded = torch.empty(*q.shape[:-1], 1, dtype=torch.bool, device=q.device)
        for part in _chunks(q.shape[-2], chunk_size):
            phi_q, query_signed = _query_features(features, q[..., part, :], reference, inplace=True)
            num, plain_den = _split(phi_q @ state)
            bound = None
            if abs_normalizer is not None or query_signed:
                normalizer = abs_normalizer if abs_normalizer is not None else _split(state)[1].mT
                bound = phi_q.abs() @ normalizer.mT
            den[..., part, :], guarded[..., part, :] = guarded_denominator(plain_den, bound, eps)
            torch.div(num, den[..., part, :], out=out[..., part, :])
        ctx.save_for_backward(q, k, v, state, reference, den, guarded, *params)
        ctx.key_mask, ctx.features, ctx.chunk_size = key_mask, features, chunk_size
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, state, reference, den, guarded, *params = ctx.saved_tensors
        features, chunk_size, key_mask = ctx.features, ctx.chunk_size, ctx.key_mask
        totals: list[torch.Tensor | None] = [None] * len(params)
        grad_q = torch.zeros_like(q) if ctx.needs_input_grad[0] else None
        grad_k = torch.zeros_like(k) if ctx.needs_input_grad[1] else None
        grad_v = torch.zeros_like(v) if ctx.needs_input_grad[2] else None
        grad_state = torch.zeros_like(state)
        for part in _chunks(q.shape[-2], chunk_size):
            q_part = _leaf(q[..., part, :], grad_q is not None)
            with torch.enable_grad():
                phi_q, _ = _query_features(features, q_part, reference)
            values = phi_q.detach()
            grad_y = _output_grads(
                grad_out[..., part, :], values @ state, den[..., part, :], guarded[..., part, :]
            )
            grad_state += values.mT @ grad_y
            (dq,) = _param_grads([phi_q], [grad_y @ state.mT], [q_part], params, totals)
            if grad_q is not None:
                assert dq is not None, "q_part requires grad whenever grad_q is allocated"
                grad_q[..., part, :] = dq
        for part in _chunks(k.shape[-2], chunk_size):
            k_part = _leaf(k[..., part, :], grad_k is not None)
            with torch.enable_grad():
                log_k, mult_k = features(k_part, False)
                if key_mask is not None:
                    log_k = log_k.masked_fill(key_mask[..., part, None], -math.inf)
                phi_k = _exp(log_k - reference, mult_k)
            if grad_v is not None:
                grad_v[..., part, :] = phi_k.detach() @ grad_state[..., :-1]
            grad_phi_k = _with_ones(v[..., part, :]) @ grad_state.mT
            (dk,) = _param_grads([phi_k], [grad_phi_k], [k_part], params, totals)
            if grad_k is not None:
                assert dk is not None, "k_part requires grad whenever grad_k is allocated"
                grad_k[..., part, :] = dk
        return grad_q, grad_k, grad_v, None, None, None, None, *totals


def _query_features(
    features: FeatureFn, q: torch.Tensor, reference: torch.Tensor, inplace: bool = False
) -> tuple[torch.Tensor, bool]:
    """Query features times the keys' column maxima ``exp(M)``, each row divided by its largest entry.

    ``inplace`` (no autograd): update the fresh log-feature tensor in place, one buffer per chunk.
    """
    log_q, mult_q = features(q, True)
    log_q = log_q + reference
    top = log_q.amax(dim=-1, keepdim=True).detach()
    if inplace:
        phi = log_q.sub_(top).exp_()
        return (phi if mult_q is None else phi * mult_q), mult_q is not None
    return _exp(log_q - top, mult_q), mult_q is not None


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
    ``exp(c_j - R_i) <= 1``, across chunks the ``m x (Dv + 1)`` state ``sum phi_k^T [v, 1]`` rescaled by
    ``exp(R_prev - R_i) <= 1``. The state entering each chunk is kept for the backward pass, which runs
    the chunks in reverse carrying the state's gradient.

    ``apply(q, k, v, key_mask, features, chunk_size, eps, *params)`` as ``NonCausalRFAttention``
    with ``N_q == N_k``.
    """

    @staticmethod
    def forward(
        ctx: Any,  # torch types the context of a custom Function as Any
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        key_mask: torch.Tensor | None,
        features: FeatureFn,
        chunk_size: int,
        eps: float,
        *params: torch.Tensor,
    ) -> torch.Tensor:
        previous = q.new_full((*q.shape[:-2], 1), -math.inf)
        state: torch.Tensor | None = None
        abs_normalizer: torch.Tensor | None = None
        states: list[torch.Tensor] = []
        previouses: list[torch.Tensor] = []
        out = v.new_empty(*q.shape[:-1], v.shape[-1])
        den = v.new_empty(*q.shape[:-1], 1)
        guarded = torch.empty(*q.shape[:-1], 1, dtype=torch.bool, device=q.device)
        for part in _chunks(q.shape[-2], chunk_size):
            mask = None if key_mask is None else key_mask[..., part]
            phi_q, _, query_signed = _row_stabilized(features, q[..., part, :], True, None)
            phi_k, scale, key_signed = _row_stabilized(features, k[..., part, :], False, mask)
            if state is None:
                state = v.new_zeros(*q.shape[:-2], phi_k.shape[-1], v.shape[-1] + 1)
                abs_normalizer = v.new_zeros(*q.shape[:-2], 1, phi_k.shape[-1]) if key_signed else None
            states.append(state)
            previouses.append(previous)
            weights, carry, decay, key_weight, end = _causal_weights(scale, previous)
            scores = (phi_q @ phi_k.mT).mul_(weights)
            v_ones = _with_ones(v[..., part, :])
            num, plain_den = _split(carry * (phi_q @ state) + scores @ v_ones)
            bound = None
            if key_signed or query_signed:
                abs_q = phi_q.abs()
                past = abs_normalizer if abs_normalizer is not None else _split(state)[1].mT
                inside = ((abs_q @ phi_k.abs().mT) * weights).sum(-1, keepdim=True)
                bound = carry * (abs_q @ past.mT) + inside
            den[..., part, :], guarded[..., part, :] = guarded_denominator(plain_den, bound, eps)
            torch.div(num, den[..., part, :], out=out[..., part, :])
            weighted_k = phi_k * key_weight
            state = state * decay.unsqueeze(-1) + weighted_k.mT @ v_ones
            if abs_normalizer is not None:
                abs_normalizer = abs_normalizer * decay.unsqueeze(-1) + weighted_k.abs().sum(-2, keepdim=True)
            previous = end
        ctx.save_for_backward(q, k, v, den, guarded, torch.stack(states), torch.stack(previouses), *params)
        ctx.key_mask, ctx.features, ctx.chunk_size = key_mask, features, chunk_size
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, den, guarded, states, previouses, *params = ctx.saved_tensors
        features, chunk_size, key_mask = ctx.features, ctx.chunk_size, ctx.key_mask
        totals: list[torch.Tensor | None] = [None] * len(params)
        grad_q = torch.zeros_like(q) if ctx.needs_input_grad[0] else None
        grad_k = torch.zeros_like(k) if ctx.needs_input_grad[1] else None
        grad_v = torch.zeros_like(v) if ctx.needs_input_grad[2] else None
        grad_state = torch.zeros_like(states[0])
        parts = _chunks(q.shape[-2], chunk_size)
        for index in reversed(range(len(parts))):
            part, state, previous = parts[index], states[index], previouses[index]
            mask = None if key_mask is None else key_mask[..., part]
            q_part = _leaf(q[..., part, :], grad_q is not None)
            k_part = _leaf(k[..., part, :], grad_k is not None)
            with torch.enable_grad():
                phi_q_graph, _, _ = _row_stabilized(features, q_part, True, None)
                phi_k_graph, scale, _ = _row_stabilized(features, k_part, False, mask)
            phi_q, phi_k = phi_q_graph.detach(), phi_k_graph.detach()
            weights, carry, decay, key_weight, _ = _causal_weights(scale, previous)
            scores = (phi_q @ phi_k.mT).mul_(weights)
            v_ones = _with_ones(v[..., part, :])
            y = carry * (phi_q @ state) + scores @ v_ones
            grad_y = _output_grads(grad_out[..., part, :], y, den[..., part, :], guarded[..., part, :])
            grad_scores = (grad_y @ v_ones.mT).mul_(weights)
            grad_phi_q = carry * (grad_y @ state.mT) + grad_scores @ phi_k
            grad_phi_k = grad_scores.mT @ phi_q + key_weight * (v_ones @ grad_state.mT)
            if grad_v is not None:
                grad_v[..., part, :] = (
                    scores.mT @ grad_y[..., :-1] + (phi_k * key_weight) @ grad_state[..., :-1]
                )
            grad_state = grad_state * decay.unsqueeze(-1) + (carry * phi_q).mT @ grad_y
            dq, dk = _param_grads(
                [phi_q_graph, phi_k_graph], [grad_phi_q, grad_phi_k], [q_part, k_part], params, totals
            )
            if grad_q is not None:
                assert dq is not None, "q_part requires grad whenever grad_q is allocated"
                grad_q[..., part, :] = dq
            if grad_k is not None:
                assert dk is not None, "k_part requires grad whenever grad_k is allocated"
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
