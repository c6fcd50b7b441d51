r"""Sliding-window hybrid: exact softmax weights inside a window of recent keys, random features beyond it.

Query $i$ weighs keys $j \in (i - w, i]$ by the exact $e^{s_{ij}}$, $s_{ij} = q_i \cdot k_j / \sqrt{D_h}$,
and earlier keys $j \le i - w$ by the random-feature estimate $\phi(q_i) \cdot \phi(k_j)$ of the same
$e^{s_{ij}}$ (unbiased, so no mixing factor), all in one normalized sum:

$$o_i = \frac{\sum_{j \le i - w} \phi(q_i) \cdot \phi(k_j)\, v_j + \sum_{i - w < j \le i} e^{s_{ij}} v_j}
             {\sum_{j \le i - w} \phi(q_i) \cdot \phi(k_j) + \sum_{i - w < j \le i} e^{s_{ij}}}.$$

Both parts are expressed relative to one reference per query,
$\rho_i = \max(\max_j s_{ij}, \log |\phi(q_i) \cdot \sum_{j \le i - w} \phi(k_j)|)$ (the largest exact
log-weight or the random-feature part's log-normalizer; for features with signs the magnitude bound
$|\phi_q| \cdot \sum_j |\phi_{k_j}|$), a detached constant that cancels exactly: no exact weight and no
feature sum exceeds about 1 relative to it, whichever part dominates.

- The random-feature part is the chunked causal kernel's
  [`chunked_products`][rf_attention.ops.causal.chunked_products] over keys shifted right by ``w``
  positions (query $i$ then sees keys $j \le i - w$): its sums come with their per-query log-scale.
- The exact part is banded: blocks of ``c = max(w, 64)`` queries (at most ``N``) against their own block
  and the one before, a ``c x 2c`` product each: ``O(N c)`` time and memory, no ``N x N`` matrix.

A learned map (``rf_features.learned``: Hedgehog, T2R) estimates no kernel: its product has a scale of its
own. With one, the hybrid is LoLCATs' (Zhang et al. 2024, "LoLCATs: On Low-Rank Linearizing of Large
Language Models"; ``hybrid_attention_quadratic`` in their ``linear_window_attention_sw.py``):
the window's weights are shifted by their own maximum $m_i = \max_{i - w < j \le i} s_{ij}$ and scaled by
the learned per-head factor $f = \sigma(\theta)$, the features are left as they are (LoLCATs' default
``affine_attention_factors=False``: factor 1 on the linear part, not $1 - f$):

$$o_i = \frac{f \sum_{i-w<j\le i} e^{s_{ij} - m_i} v_j + \sum_{j\le i-w} \phi(q_i) \cdot \phi(k_j) v_j}
             {f \sum_{i-w<j\le i} e^{s_{ij} - m_i} + \sum_{j\le i-w} \phi(q_i) \cdot \phi(k_j)}.$$

$m_i$ is part of the formula, not a stabilizer (the features are not shifted by it; its gradient
counts): the window's weights lie in $(0, f]$, on the scale of the bounded learned features. The code
passes the window's log-weights $s_{ij} - m_i + \log f$
([`factored_scores`][rf_attention.ops.window.factored_scores]) to the same normalized sum and reference as
above. ``w >= N`` (no feature part) is exact causal softmax whatever ``f``; rows whose window holds no key
(padding) keep the features alone.

[`window_attention`][rf_attention.ops.window.window_attention] is the training form; decoding keeps
[`WindowState`][rf_attention.ops.window.WindowState] (the random-feature sums of the keys older than the
window and a ring of the last ``w`` keys and values: ``O(m D_v + w D_h)`` whatever the context),
built by [`window_prefill`][rf_attention.ops.window.window_prefill] and advanced by
[`window_step`][rf_attention.ops.window.window_step].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from rf_attention.ops.causal import chunked_products, weighted_key_sums
from rf_attention.ops.common import FeatureFn, finite_or_zero, guarded_denominator, with_ones
from rf_attention.ops.features import row_stabilized_features

#: The fewest queries per block of the banded exact part (small windows still run in few blocks).
MIN_WINDOW_BLOCK = 64


class FeaturePart(NamedTuple):
    """The random-feature sums of each query relative to its log-scale (true sums: ``sums * e^log_scale``).

    Attributes:
        sums: ``(..., n, Dv + 1)``: numerator and normalizer.
        log_scale: ``(..., n, 1)``, detached.
        bound: ``(..., n, 1)``: ``|phi_q| . sum_j |phi_k_j|`` on the same scale (features with signs), or
            None (positive features).
    """

    sums: torch.Tensor
    log_scale: torch.Tensor
    bound: torch.Tensor | None


def combined(
    scores: torch.Tensor, values: torch.Tensor, part: FeaturePart | None, eps: float
) -> torch.Tensor:
    r"""The hybrid output from the window's exact log-weights and the random-feature sums (module formula).

    Args:
        scores: ``(..., n, s)``: $s_{ij}$ of each query's window keys, ``-inf`` where a key is outside
            the window, padding or absent.
        values: ``(..., s, Dv + 1)`` matching ``[v, 1]`` (the leading shape of ``scores`` but the query
            axis).
        part: the random-feature part, ``(..., n, .)``, or None (every key is in the window).
        eps: relative guard of the normalizer
            ([`guarded_denominator`][rf_attention.ops.common.guarded_denominator]).

    Returns:
        ``(..., n, Dv)``; rows that see no key give 0.
    """
    reference = scores.detach().amax(dim=-1, keepdim=True)
    if part is not None:
        magnitude = part.sums[..., -1:] if part.bound is None else part.bound
        feature_top = magnitude.detach().log() + part.log_scale
        reference = torch.maximum(reference, feature_top)
    safe = finite_or_zero(reference)
    weights = torch.sub(scores, safe).exp_()  # every entry at most 1; 0 outside the window
    sums = weights @ values
    bound = None
    if part is not None:
        # 0 where the features see no key (then the log-scale may exceed the reference)
        factor = torch.exp(part.log_scale - safe).masked_fill(feature_top == -math.inf, 0.0)
        sums = torch.addcmul(sums, part.sums, factor)
        if part.bound is not None:
            bound = torch.addcmul(sums[..., -1:].detach(), part.bound.detach(), factor)
    num, den = sums[..., :-1], sums[..., -1:]
    den, _ = guarded_denominator(den, bound, eps)
    return num / den


def factored_scores(scores: torch.Tensor, log_factor: torch.Tensor) -> torch.Tensor:
    r"""LoLCATs' window log-weights of a learned map: $s_{ij} - m_i + \log f$ (module formula).

    Args:
        scores: ``(..., n, s)``: $s_{ij}$ of each query's window keys, ``-inf`` outside the window.
        log_factor: $\log f$, broadcastable to ``(..., n, 1)`` (``()`` or per head).

    Returns:
        ``(..., n, s)``: at most $\log f$; ``-inf`` where ``scores`` is (a row of ``-inf`` stays one).
    """
    top = finite_or_zero(scores.amax(dim=-1, keepdim=True))  # m_i, not detached: part of the formula
    return scores - top + log_factor


def feature_part(
    features: FeatureFn,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    *,
    lag: int,
    chunk: int,
) -> FeaturePart:
    """Causal random-feature sums of query ``i`` over keys ``j <= i - lag`` (the keys shifted by ``lag < n``).

    ``q, k (..., n, d)``, ``v (..., n, Dv)``, ``key_mask (..., n)`` or None; ``features`` gives the
    unstabilized log-features (every constant kept: the sums estimate ``sum_j e^{s_ij} [v_j, 1]``).
    """
    lead, n = q.shape[:-2], q.shape[-2]
    size = math.prod(lead)
    phi_q, query_top, query_signed = row_stabilized_features(features, q, True, None)
    phi_k, key_scale, key_signed = row_stabilized_features(features, k, False, key_mask)
    m = phi_q.shape[-1]
    phi_k, v = (F.pad(x[..., : n - lag, :], (0, 0, lag, 0)) for x in (phi_k, v))
    key_scale = F.pad(key_scale[..., : n - lag], (lag, 0), value=-math.inf)
    signed = query_signed or key_signed
    ch = chunked_products(
        phi_q.reshape(size, n, m),
        phi_k.reshape(size, n, m),
        key_scale.reshape(size, n),
        v.reshape(size, n, v.shape[-1]),
        None,
        None,
        None,
        chunk,
        signed,
    )
    assert ch.y is not None, "asked for"
    sums = ch.y.view(size, -1, ch.y.shape[-1])[:, :n].reshape(*lead, n, -1)
    bound = None if ch.bound is None else ch.bound.view(size, -1, 1)[:, :n].reshape(*lead, n, 1)
    # chunked_products' per-query reference: the running maximum of the keys' log-scales (0 while none)
    reference = finite_or_zero(torch.cummax(key_scale, dim=-1).values)
    return FeaturePart(sums, (reference + query_top).unsqueeze(-1), bound)


def banded_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    window: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The window's exact log-weights by blocks: each block of ``c`` queries against ``2c`` keys.

    ``q, k (..., n, d)``, ``v (..., n, Dv)``, ``key_mask (..., n)`` or None. The ``t`` blocks of
    ``c = min(n, max(window, MIN_WINDOW_BLOCK))`` queries read their own block of keys and the one before
    (only their own when ``c = n``), which holds every key of a window of ``window <= c``.

    Returns:
        ``scores (..., t, c, s)`` (``s = 2c``, or ``c`` for one block): $s_{ij}$, ``-inf`` outside the
        window and at padding (rows past ``n`` in the last block are padding queries); and ``[v, 1]`` of
        the keys ``(..., t, s, Dv + 1)``.
    """
    n = q.shape[-2]
    c = min(n, max(window, MIN_WINDOW_BLOCK))
    t = -(-n // c)
    pad = t * c - n
    padding = torch.zeros(n, dtype=torch.bool, device=q.device) if key_mask is None else key_mask
    padding = F.pad(padding, (0, pad), value=True)
    q, k, v_ones = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, with_ones(v)))
    blocks = [x.unflatten(-2, (t, c)) for x in (q, k, v_ones)]
    key_blocks, value_blocks = blocks[1], blocks[2]
    key_padding = padding.unflatten(-1, (t, c))
    offset = 0
    if t > 1:  # keys of the block before (none before the first: padding)
        key_blocks, value_blocks = (
            torch.cat((F.pad(x, (0, 0, 0, 0, 1, 0))[..., :-1, :, :], x), dim=-2) for x in blocks[1:]
        )
        key_padding = torch.cat((F.pad(key_padding, (0, 0, 1, 0), value=True)[..., :-1, :], key_padding), -1)
        offset = c
    # query b of a block and key a of its keys are offset + b - a positions apart
    positions = torch.arange(c, device=q.device)
    distance = offset + positions.unsqueeze(-1) - torch.arange(offset + c, device=q.device)
    outside = (distance < 0) | (distance >= window)  # (c, s)
    scores = (blocks[0] @ key_blocks.mT).mul_(scale)
    return scores.masked_fill_(outside | key_padding.unsqueeze(-2), -math.inf), value_blocks


def window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    features: FeatureFn,
    *,
    window: int,
    scale: float,
    chunk: int,
    eps: float,
    log_factor: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""Causal sliding-window hybrid attention (module formula) in ``O(N (w + m))`` time and memory.

    Args:
        q: ``(..., N, d)``, in the accumulation dtype.
        k: ``(..., N, d)``.
        v: ``(..., N, Dv)``.
        key_mask: bool ``(..., N)``, True at padding, or None.
        features: unstabilized log-features of ``(..., n, d)`` inputs (they scale their inputs
            themselves), every constant kept: $\phi(q) \cdot \phi(k)$ estimates $e^{s}$ itself.
        window: ``w >= 1``, the keys $(i - w, i]$ weighed exactly; ``w >= N`` is exact causal softmax.
        scale: the logit scale of $s_{ij} = $ ``scale`` $q_i \cdot k_j$ (``Dh ** -0.5``).
        chunk: positions per chunk of the random-feature part's causal kernel.
        eps: relative guard of the normalizer.
        log_factor: a learned map's $\log f$, broadcastable to ``(..., N, 1)``: LoLCATs' window weights
            ([`factored_scores`][rf_attention.ops.window.factored_scores]); None for a random-feature pair.

    Autograd keeps the exact part's weights ``(..., N, 2c)``, the features ``(..., N, m)`` and the causal
    kernel's chunk intermediates (``(..., N, chunk)`` products): ``O(N (w + m))``.

    Returns:
        ``(..., N, Dv)``; a row that sees no key (all padding) gives 0.
    """
    n = q.shape[-2]
    scores, values = banded_scores(q, k, v, key_mask, window, scale)
    if log_factor is not None:  # blocks (..., t, c, s): one more axis than (..., N, 1)
        scores = factored_scores(scores, log_factor.unsqueeze(-1))
    part = None
    if window < n:
        part = feature_part(features, q, k, v, key_mask, lag=window, chunk=chunk)
        blocks = scores.shape[-3:-1]  # (t, c): the banded part's layout of the queries
        pad = blocks[0] * blocks[1] - n

        def laid_out(x: torch.Tensor) -> torch.Tensor:
            return F.pad(x, (0, 0, 0, pad)).unflatten(-2, blocks)

        bound = None if part.bound is None else laid_out(part.bound)
        part = FeaturePart(laid_out(part.sums), laid_out(part.log_scale), bound)
    out = combined(scores, values, part, eps)
    return out.flatten(-3, -2)[..., :n, :]


@dataclass
class WindowState:
    r"""The decoding state of the hybrid: feature sums of the keys older than the window, a ring of the rest.

    After $t$ tokens, the sums hold keys $j < t - w$ (relative to the log-scale ``reference``, as
    [`CausalState`][rf_attention.ops.causal.CausalState]'s) and the ring the keys and values of positions
    $t - w, \dots, t - 1$: ``O(m Dv + w Dh)`` memory, independent of $t$. Each step moves the ring's
    oldest key into the sums and writes the new one in its slot (in place).

    Attributes:
        sums: ``(..., m, Dv + 1)``: ``sum_j exp(c_j - R) phi_k_j^T [v_j, 1]``.
        magnitude: ``(..., m)``: ``sum_j exp(c_j - R) |phi_k_j|`` (the guard of signed features).
        reference: ``(...)``: ``R``, ``-inf`` while no key has left the window.
        keys: ``(..., w, Dh)``: the ring of the last ``w`` keys.
        values: ``(..., w, Dv)``.
        empty: bool ``(B, w)``: True where a slot holds padding or no token yet.
        cursor: the slot of the oldest key (the next one written).
        length: tokens seen, padding included: an ``int``, or ``(B,)`` for packed prompts.
        signed: the features have signs (the normalizer's guard then uses ``magnitude``).
    """

    sums: torch.Tensor
    magnitude: torch.Tensor
    reference: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    empty: torch.Tensor
    cursor: int
    length: int | torch.Tensor
    signed: bool

    @property
    def window(self) -> int:
        """``w``, the ring's size."""
        return self.keys.shape[-2]

    def nbytes(self) -> int:
        """Bytes held (independent of ``length``)."""
        tensors = (self.sums, self.magnitude, self.reference, self.keys, self.values, self.empty)
        return sum(t.numel() * t.element_size() for t in tensors)

    def select(self, index: torch.Tensor) -> WindowState:
        """The state of batch rows ``index`` (``(B',)`` integers; beam search reorders with it)."""
        index = index.to(self.sums.device)
        length = self.length[index] if isinstance(self.length, torch.Tensor) else self.length
        sums, magnitude, reference, keys, values, empty = (
            t.index_select(0, index)
            for t in (self.sums, self.magnitude, self.reference, self.keys, self.values, self.empty)
        )
        return WindowState(sums, magnitude, reference, keys, values, empty, self.cursor, length, self.signed)


def window_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    padding: torch.Tensor | None,
    features: FeatureFn,
    *,
    window: int,
    scale: float,
    chunk: int,
    eps: float,
    signed: bool,
    ends: torch.Tensor | None = None,
    log_factor: torch.Tensor | None = None,
) -> tuple[torch.Tensor, WindowState]:
    r"""[`window_attention`][rf_attention.ops.window.window_attention] of a prompt and the state it leaves.

    Args:
        q: ``(B, H, N, Dh)`` in the accumulation dtype.
        k: ``(B, H, N, Dh)``.
        v: ``(B, H, N, Dv)``.
        padding: bool ``(B, N)``, True at padding, or None.
        features: as for ``window_attention``.
        window: ``w >= 1``.
        scale: the logit scale.
        chunk: positions per chunk of the causal kernel.
        eps: relative guard of the normalizer.
        signed: the features have signs.
        ends: ``(B,)``: row ``b``'s prompt ends at ``ends[b]`` (packed prompts, right-padded); None: at
            ``N``. The ring holds the ``w`` positions before it.
        log_factor: a learned map's $\log f$ (``()`` or ``(H, 1, 1)``), or None: as for
            ``window_attention``.

    Returns:
        ``(out (B, H, N, Dv), state)``.
    """
    b, h, n, d = q.shape
    key_mask = None if padding is None else padding[:, None, :].expand(b, h, n)
    out = window_attention(
        q, k, v, key_mask, features, window=window, scale=scale, chunk=chunk, eps=eps, log_factor=log_factor
    )
    last = torch.full((b,), n, device=q.device) if ends is None else ends.to(q.device)
    positions = torch.arange(n, device=q.device)
    outside = positions >= (last - window).unsqueeze(-1)  # (B, N): in the window of the next token
    if padding is not None:
        outside = outside | padding
    phi_k, key_scale, _ = row_stabilized_features(features, k, False, outside[:, None, :].expand(b, h, n))
    reference = key_scale.amax(dim=-1)
    sums, magnitude = weighted_key_sums(phi_k, key_scale, with_ones(v), finite_or_zero(reference))
    slots = (last - window).unsqueeze(-1) + torch.arange(window, device=q.device)  # (B, w), oldest first
    index = slots.clamp(0, n - 1)
    empty = slots < 0
    if padding is not None:
        empty = empty | padding.gather(-1, index)
    gather = index[:, None, :, None]
    keys = k.gather(-2, gather.expand(b, h, window, d))
    values = v.gather(-2, gather.expand(b, h, window, v.shape[-1]))
    length: int | torch.Tensor = n if ends is None else last
    return out, WindowState(sums, magnitude, reference, keys, values, empty, 0, length, signed)


def window_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    padding: torch.Tensor | None,
    state: WindowState,
    features: FeatureFn,
    *,
    scale: float,
    eps: float,
    log_factor: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""One new token ``q, k, v (B, H, 1, .)`` (``padding (B,)`` or None) against ``state``, in place.

    The ring's oldest key $t - w$ joins the feature sums, the new key takes its slot, and the query reads
    the sums (keys $j \le t - w$) and the ring (keys $t - w < j \le t$) through
    [`combined`][rf_attention.ops.window.combined], as the forward pass does: ``O(m (Dh + Dv) + w Dh)``.
    ``log_factor``: a learned map's $\log f$ (``()`` or ``(H, 1, 1)``), or None, as for the forward pass.

    Returns:
        ``(B, H, 1, Dv)``.
    """
    b, h = q.shape[:2]
    slot = state.cursor
    old_padding = state.empty[:, slot, None, None].expand(b, h, 1)
    phi_old, old_scale, _ = row_stabilized_features(
        features, state.keys[..., slot : slot + 1, :], False, old_padding
    )
    reference = torch.maximum(state.reference, old_scale[..., 0])
    safe = finite_or_zero(reference)
    decay = torch.exp(state.reference - safe)
    added, added_magnitude = weighted_key_sums(
        phi_old, old_scale, with_ones(state.values[..., slot : slot + 1, :]), safe
    )
    state.sums = torch.addcmul(added, state.sums, decay[..., None, None])
    state.magnitude = torch.addcmul(added_magnitude, state.magnitude, decay[..., None])
    state.reference = reference
    state.keys[..., slot, :] = k[..., 0, :]
    state.values[..., slot, :] = v[..., 0, :]
    state.empty[:, slot] = False if padding is None else padding
    state.cursor = (slot + 1) % state.window
    state.length = state.length + 1
    scores = (q @ state.keys.mT).mul_(scale).masked_fill_(state.empty[:, None, None, :], -math.inf)
    if log_factor is not None:
        scores = factored_scores(scores, log_factor)
    phi_q, query_top, _ = row_stabilized_features(features, q, True, None)
    sums = phi_q @ state.sums
    bound = phi_q.abs() @ state.magnitude.unsqueeze(-1) if state.signed else None
    part = FeaturePart(sums, (safe[..., None] + query_top).unsqueeze(-1), bound)
    return combined(scores, with_ones(state.values), part, eps)
