"""Chunk-parallel random-feature attention: a fixed number of batched operations per call, whatever N.

The sequence is cut into a few *groups* of rows, as many as keep one group's features no larger than the
query tensor itself (``group_rows``; causal groups of the closed-form kernel take twice the rows): their
number depends on the feature width and the head dimension, never on N. Each group is one batched
computation:

- non-causal (Eq. 7): a group of keys gives its ``m x (Dv + 1)`` sums ``phi_k^T [v, 1]`` by one matmul; a
  group of queries reads them by one matmul;
- causal: a group is cut into chunks of ``chunk`` positions, all processed at once: per-chunk key sums by
  one batched matmul, the state entering every chunk by one ``T x T`` decay-weighted prefix sum over the
  chunks (one batched matmul), the intra-chunk masked products by batched ``chunk x chunk`` matmuls. The
  state leaving a group enters the next.

Two implementations share that layout:

- ``closed_form_attention``: for feature maps with a closed form (``rf_features.ExponentialForm``, every
  component of Section 3.2). Two ``torch.autograd.Function`` s (``_NonCausal``, ``_Causal``) keep ``q, k, v``,
  the sums passed between groups and the normalizers; their backward passes recompute each group's
  features (and, causal, its chunk products) and apply hand-written vector-Jacobian products, returning the
  gradients of ``q, k, v`` and of the closed form's ``A, g, c`` (autograd carries these on to the weight
  matrix). No ``torch.autograd.grad`` inside, so the whole step traces under ``torch.compile``.
- ``noncausal_attention`` / ``causal_attention``: for any ``FeatureFn`` (a component without a closed form,
  ``linear_attention``'s given features). Each group runs under ``torch.utils.checkpoint``, and the backward
  pass is autograd's through the same operations.

In both, the stabilizers are detached constants that cancel exactly, so every gradient is that of the plain
formula ``phi_q (phi_k^T v) / (phi_q phi_k^T 1)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from rf_features import ExponentialForm

#: ``features(x, is_query) -> (log_features, multiplier)`` as ``FeatureMap.weighted_log_features``.
FeatureFn = Callable[[torch.Tensor, bool], tuple[torch.Tensor, torch.Tensor | None]]
#: Positions per chunk of the causal kernel (the intra-chunk products are ``chunk x chunk``).
DEFAULT_CHUNK_SIZE = 128
#: A group's features hold at most this many elements per element of ``q`` (the memory rule of the groups).
GROUP_FEATURES_PER_QUERY_ELEMENT = 1.0
#: The same for a causal group of the closed-form kernel: a causal group costs about twice the operations of a
#: non-causal one (chunk products and their VJPs), so it takes twice the rows (half the groups).
CAUSAL_GROUP_FEATURES_PER_QUERY_ELEMENT = 2.0


def guarded_denominator(
    den: torch.Tensor, bound: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The normalizer ``D`` made safe to divide by, and where it was changed.

    Positive features (``bound`` None): only ``D == 0`` changes (to 1; no key is seen, the numerator is 0).
    Signed features: ``|D| <= eps * bound`` with ``bound = |phi_q| . sum_j |phi_k_j| >= |D|`` becomes
    ``sign(D) eps bound`` (1 where ``bound == 0``): a relative guard, blind to the features' overall scale.
    A replaced ``D`` is a constant (no gradient).

    Args:
        den: ``(..., N, 1)``.
        bound: ``(..., N, 1)`` or None.
        eps: relative size of the guard.
    """
    if bound is None:
        guarded = den == 0
        return torch.where(guarded, torch.ones_like(den), den), guarded
    floor = eps * bound.detach()
    guarded = den.abs() <= floor
    sign = torch.where(den < 0, -1.0, 1.0).to(den.dtype)
    safe = torch.where(floor > 0, sign * floor, torch.ones_like(floor))
    return torch.where(guarded, safe, den), guarded


def finite_or_zero(x: torch.Tensor) -> torch.Tensor:
    """``x`` with ``-inf`` (an empty maximum: no key seen) replaced by 0; one operation."""
    return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


def with_ones(v: torch.Tensor) -> torch.Tensor:
    """``[v, 1]`` ``(..., n, Dv + 1)``: one product then gives numerator and normalizer together."""
    return F.pad(v, (0, 1), value=1.0)


def _exp(log_x: torch.Tensor, mult: torch.Tensor | None) -> torch.Tensor:
    features = torch.exp(log_x)
    return features if mult is None else features * mult


def group_rows(n: int, dim: int, width: int, multiple: int = 1, per_element: float | None = None) -> int:
    """Rows per group: the most whose ``width`` features hold no more elements than ``n`` rows of ``dim``.

    (times ``per_element``, default ``GROUP_FEATURES_PER_QUERY_ELEMENT``). A multiple of ``multiple`` (the
    causal chunk), at least one ``multiple``. The number of groups, ``ceil(n / rows)``, is about
    ``width / (dim * per_element)`` whatever ``n``.
    """
    factor = GROUP_FEATURES_PER_QUERY_ELEMENT if per_element is None else per_element
    rows = int(n * dim * factor) // max(1, width)
    return max(multiple, rows // multiple * multiple)


def _groups(n: int, rows: int) -> list[slice]:
    return [slice(start, min(start + rows, n)) for start in range(0, n, rows)]


def _recomputed(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``, its intermediate tensors recomputed in the backward pass instead of kept."""
    if not torch.is_grad_enabled():
        return function(*args)
    return checkpoint(function, *args, use_reentrant=False)


# ---------------------------------------------------------------------------------------------- non-causal


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
    phi_k = _exp(log_k - finite_or_zero(top), mult_k)
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
    phi_q = _exp(log_q - log_q.detach().amax(dim=-1, keepdim=True), mult_q)
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
        rows: rows per group; None: [`group_rows`][rf_attention._kernels.group_rows].
        eps: relative guard of the normalizer.
    """
    key_rows = rows or group_rows(k.shape[-2], k.shape[-1], width)
    sums = [
        _recomputed(_key_sums, features, k[..., part, :], v[..., part, :], _part(key_mask, part))
        for part in _groups(k.shape[-2], key_rows)
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
        _recomputed(_query_outputs, features, q[..., part, :], state, magnitude, reference, eps)
        for part in _groups(q.shape[-2], query_rows)
    ]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)


def _part(mask: torch.Tensor | None, part: slice) -> torch.Tensor | None:
    return None if mask is None else mask[..., part]


# ------------------------------------------------------------------------------------------------- causal


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
    """All [`causal_block`][rf_attention._kernels.causal_block] computes before the normalizer's guard.

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


def row_stabilized_features(
    features: FeatureFn, x: torch.Tensor, is_query: bool, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Features ``(..., n, m)``, each row divided by ``exp`` of its largest log-feature.

    Also returns that log-scale ``(..., n)`` (detached; ``-inf`` at padding, whose features are 0) and
    whether the features have signs.
    """
    log_x, mult_x = features(x, is_query)
    top = log_x.detach().amax(dim=-1, keepdim=True)
    if mask is not None:
        top = top.masked_fill(mask[..., None], -math.inf)
    phi = _exp(log_x - finite_or_zero(top), mult_x)
    if mask is not None:
        phi = phi.masked_fill(mask[..., None], 0.0)
    return phi, top.squeeze(-1), mult_x is not None


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

    Each group is one [`causal_block`][rf_attention._kernels.causal_block] (all its chunks at once); the
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
    for part in _groups(n, rows):
        out, state, magnitude, reference = _recomputed(
            _causal_group,
            features,
            q[..., part, :],
            k[..., part, :],
            v[..., part, :],
            _part(key_mask, part),
            state,
            magnitude,
            reference,
            chunk,
            eps,
        )
        outs.append(out)
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)


# ------------------------------------------------------------------- closed-form features, hand-written VJPs


class FeatureSide(NamedTuple):
    """The closed-form features of one side (``rf_features.ExponentialForm``) laid out for the kernels.

    ``projection`` ``(G, 2d, r)`` multiplies ``[x, x * x]``: positive features, ``r = m`` log-features;
    trigonometric, ``r = m/2 + 1``: ``m / 2`` phases and, last, the row's ``g . (x * x)``. ``offset``
    ``(G, 1, m)``, ``sign`` ``(m,)`` or None.
    """

    projection: torch.Tensor
    offset: torch.Tensor
    sign: torch.Tensor | None
    trigonometric: bool


def feature_side(form: ExponentialForm, lead: torch.Size, dtype: torch.dtype) -> FeatureSide:
    """``form`` for inputs of leading shape ``lead`` (flattened to ``G``), in ``dtype``."""
    a, g = form.matrix.to(dtype), form.square_weight.to(dtype)
    r, d = a.shape[-2:]
    if form.trigonometric:
        top = F.pad(a.mT, (0, 1))  # (..., d, r + 1): the phases, then a zero column
        bottom = F.pad(g.unsqueeze(-1), (r, 0))  # (..., d, r + 1): zeros, then g
        projection = torch.cat(torch.broadcast_tensors(top, bottom), dim=-2)
    else:
        projection = torch.cat(torch.broadcast_tensors(a, g.unsqueeze(-2).expand(*g.shape[:-1], r, d)), -1).mT
    size = math.prod(lead)
    projection = projection.expand(*lead, *projection.shape[-2:]).reshape(size, *projection.shape[-2:])
    offset = form.offset.to(dtype)
    offset = offset.expand(*lead, offset.shape[-1]).reshape(size, 1, offset.shape[-1])
    sign = None if form.sign is None else form.sign.to(dtype)
    return FeatureSide(projection, offset, sign, form.trigonometric)


class _Features(NamedTuple):
    """One group's features and what their VJP needs."""

    phi: torch.Tensor  # (G, n, m)
    magnitude: torch.Tensor  # (G, n, m): exp(log - stabilizer) * sign (phi itself for positive features)
    waves: torch.Tensor | None  # (G, n, m): [cos, sin] of the phases (trigonometric), else None
    squares: torch.Tensor  # (G, n, 2d): [x, x * x]


#: How a group's log-features are stabilized: by each row's maximum, each column's, or a given tensor.
Stabilizer = Literal["row", "column"] | torch.Tensor


def _features(
    x: torch.Tensor, side: FeatureSide, mask: torch.Tensor | None, stabilizer: Stabilizer
) -> tuple[_Features, torch.Tensor]:
    """Features of ``x (G, n, d)``, ``exp(log - M) * sign [* waves]``, and the maximum ``M`` subtracted.

    ``M`` is the rows' maxima ``(G, n, 1)``, the columns' ``(G, 1, m)`` (``-inf`` where every key is
    padding; 0 is subtracted there) or the given tensor. Padded rows (``mask (G, n)``) are 0. The
    log-features are computed in place: one ``n x m`` tensor for positive features.
    """
    squares = torch.cat((x, x * x), dim=-1)
    waves = None
    if side.trigonometric:
        u = torch.bmm(squares, side.projection)
        phases = u[..., :-1]
        waves = torch.cat((phases.cos(), phases.sin()), dim=-1)
        log_x = u[..., -1:] + side.offset
    else:
        log_x = torch.baddbmm(side.offset, squares, side.projection)
    if mask is not None:
        log_x = log_x.masked_fill_(mask.unsqueeze(-1), -math.inf)
    if isinstance(stabilizer, torch.Tensor):
        top = stabilizer
    else:
        top = log_x.amax(dim=-1 if stabilizer == "row" else -2, keepdim=True)
    magnitude = log_x.sub_(finite_or_zero(top)).exp_()
    if side.sign is not None:
        magnitude = magnitude.mul_(side.sign)
    phi = magnitude if waves is None else magnitude * waves
    return _Features(phi, magnitude, waves, squares), top


def _feature_vjp(
    grad_phi: torch.Tensor, x: torch.Tensor, f: _Features, side: FeatureSide
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of ``x (G, n, d)``, the projection and the offset from ``grad_phi (G, n, m)`` (overwritten).

    The stabilizers are constants (they cancel exactly in attention). Positive: ``dL = dphi * phi``.
    Trigonometric: ``dL = dphi * phi`` for the log-magnitude, and for the phase of row ``l``
    ``dtheta = dphi_sin * mag_sin * cos - dphi_cos * mag_cos * sin``.
    """
    if f.waves is None:
        grad_u = grad_log = grad_phi.mul_(f.phi)
    else:
        r = f.waves.shape[-1] // 2
        grad_waves = grad_phi * f.magnitude
        grad_log = grad_phi.mul_(f.phi)
        cos, sin = f.waves[..., :r], f.waves[..., r:]
        grad_phase = torch.addcmul(grad_waves[..., r:] * cos, grad_waves[..., :r], sin, value=-1.0)
        grad_u = torch.cat((grad_phase, grad_log.sum(dim=-1, keepdim=True)), dim=-1)
    grad_squares = torch.bmm(grad_u, side.projection.mT)
    d = x.shape[-1]
    grad_x = torch.addcmul(grad_squares[..., :d], x, grad_squares[..., d:], value=2.0)
    return grad_x, torch.bmm(f.squares.mT, grad_u), grad_log.sum(dim=-2, keepdim=True)


def _row_groups(x: torch.Tensor | None, rows: int, count: int) -> list[torch.Tensor | None]:
    """``count`` groups of ``rows`` rows (dim 1) of ``x`` by one ``split`` (all None for None)."""
    return [None] * count if x is None else list(x.split(rows, dim=1))


def _accumulate(total: torch.Tensor | None, part: torch.Tensor) -> torch.Tensor:
    return part if total is None else total + part


def _guard_gradient(
    out: torch.Tensor, den: torch.Tensor, free: torch.Tensor, grad_out: torch.Tensor
) -> torch.Tensor:
    """``d[numerator, normalizer]`` ``(G, n, Dv + 1)`` of ``out = numerator / den``.

    ``free``: where ``den`` is the normalizer itself (not replaced by the guard, which is a constant).
    """
    grad_num = grad_out / den
    grad_den = -(grad_num * out).sum(dim=-1, keepdim=True) * free
    return torch.cat((grad_num, grad_den), dim=-1)


class _Gradients:
    """The gradients a kernel Function returns: ``q, k, v`` by groups, the feature sides summed."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: tuple[int, int]) -> None:
        self.q, self.k, self.v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self.q_parts = self.q.split(rows[0], dim=1)
        self.k_parts, self.v_parts = self.k.split(rows[1], dim=1), self.v.split(rows[1], dim=1)
        self.sides: list[torch.Tensor | None] = [None] * 4

    def side(self, index: int, projection: torch.Tensor, offset: torch.Tensor) -> None:
        """Add a group's gradients of a side's projection and offset (index 0: queries, 1: keys)."""
        self.sides[2 * index] = _accumulate(self.sides[2 * index], projection)
        self.sides[2 * index + 1] = _accumulate(self.sides[2 * index + 1], offset)

    def result(self) -> tuple[torch.Tensor | None, ...]:
        """In the order of the Functions' inputs (the non-tensor ones get None)."""
        return (self.q, self.k, self.v, None, *self.sides, *[None] * 5)


class _NonCausal(torch.autograd.Function):
    """Non-causal attention with closed-form features (Eq. 7); the backward recomputes each group's features.

    Saved: the inputs, the key sums and column maxima, the outputs and normalizers; never ``N x m`` features.
    """

    @staticmethod
    def forward(  # type: ignore[override]
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
        key_masks = _row_groups(key_mask, key_rows, len(key_parts))
        for k_part, v_part, mask in zip(key_parts, v.split(key_rows, dim=1), key_masks, strict=True):
            f, top = _features(k_part, ks, mask, "column")
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
            f, _ = _features(q_part, qs, None, "row")
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
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        (
            q, k, v, key_mask, query_projection, query_offset, key_projection, key_offset, query_sign,
            state, reference, den, free,
        ) = ctx.saved_tensors  # fmt: skip
        trigonometric, query_rows, key_rows = ctx.config
        qs = FeatureSide(query_projection, query_offset + reference, query_sign, trigonometric)
        ks = FeatureSide(key_projection, key_offset, None, trigonometric)
        grads = _Gradients(q, k, v, (query_rows, key_rows))
        grad_state: torch.Tensor | None = None
        groups = zip(*(x.split(query_rows, dim=1) for x in (q, den, free, grad_out)), strict=True)
        for index, (q_part, den_part, free_part, grad_part) in enumerate(groups):
            f, _ = _features(q_part, qs, None, "row")
            out_part = torch.bmm(f.phi, state[..., :-1]).div_(den_part)  # recomputed, not kept
            gy = _guard_gradient(out_part, den_part, free_part.to(den.dtype), grad_part)
            grad_state = _accumulate(grad_state, torch.bmm(f.phi.mT, gy))
            gx, gp, gb = _feature_vjp(torch.bmm(gy, state.mT), q_part, f, qs)
            grads.q_parts[index].copy_(gx)
            grads.side(0, gp, gb)
            del f, out_part, gy, gx
        assert grad_state is not None, "q has at least one row"
        key_parts = k.split(key_rows, dim=1)
        key_masks = _row_groups(key_mask, key_rows, len(key_parts))
        groups_k = zip(key_parts, v.split(key_rows, dim=1), key_masks, strict=True)
        for index, (k_part, v_part, mask) in enumerate(groups_k):
            f, _ = _features(k_part, ks, mask, reference)  # relative to the column maxima of all keys
            grads.v_parts[index].copy_(torch.bmm(f.phi, grad_state[..., :-1]))
            gx, gp, gb = _feature_vjp(torch.bmm(with_ones(v_part), grad_state.mT), k_part, f, ks)
            grads.k_parts[index].copy_(gx)
            grads.side(1, gp, gb)
            del f, gx
        return grads.result()


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
    def forward(  # type: ignore[override]
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
        masks = _row_groups(key_mask, rows, len(parts[0]))
        for q_part, k_part, v_part, out_part, den_part, free_part, mask in zip(*parts, masks, strict=True):
            if state is not None and reference is not None:
                states.append(state)
                references.append(reference)
            fq, _ = _features(q_part, qs, None, "row")
            fk, scale = _features(k_part, ks, mask, "row")
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
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        (
            q, k, v, key_mask, query_projection, query_offset, key_projection, key_offset, query_sign,
            entering_states, entering_references, out, den, free,
        ) = ctx.saved_tensors  # fmt: skip
        trigonometric, rows, chunk = ctx.config
        qs = FeatureSide(query_projection, query_offset, query_sign, trigonometric)
        ks = FeatureSide(key_projection, key_offset, None, trigonometric)
        grads = _Gradients(q, k, v, (rows, rows))
        grad_state: torch.Tensor | None = None
        parts = [x.split(rows, dim=1) for x in (q, k, v, out, den, free, grad_out)]
        masks = _row_groups(key_mask, rows, len(parts[0]))
        for index in reversed(range(len(masks))):
            q_part, k_part, v_part, out_part, den_part, free_part, grad_part = (p[index] for p in parts)
            state = None if index == 0 else entering_states[index - 1]
            reference = None if index == 0 else entering_references[index - 1]
            fq, _ = _features(q_part, qs, None, "row")
            fk, scale = _features(k_part, ks, masks[index], "row")
            ch = chunked_products(
                fq.phi, fk.phi, scale.squeeze(-1), v_part, state, None, reference, chunk, False, outputs=False
            )
            size, n, m = fq.phi.shape
            c = ch.pq.shape[-2]
            gy = _guard_gradient(out_part, den_part, free_part.to(den.dtype), grad_part)
            if n % c:
                gy = F.pad(gy, (0, 0, 0, c - n % c))
            grad_pq, grad_pk, grad_pv, grad_state = _chunked_vjp(
                ch, gy.view(-1, c, gy.shape[-1]), grad_state, index > 0
            )
            grads.v_parts[index].copy_(grad_pv.view(size, -1, grad_pv.shape[-1])[:, :n, :-1])
            gx, gp, gb = _feature_vjp(grad_pq.view(size, -1, m)[:, :n], q_part, fq, qs)
            grads.q_parts[index].copy_(gx)
            grads.side(0, gp, gb)
            gx, gp, gb = _feature_vjp(grad_pk.view(size, -1, m)[:, :n], k_part, fk, ks)
            grads.k_parts[index].copy_(gx)
            grads.side(1, gp, gb)
            del fq, fk, ch, gy, grad_pq, grad_pk, grad_pv, gx
        return grads.result()


def closed_form_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None,
    query_form: ExponentialForm,
    key_form: ExponentialForm,
    *,
    causal: bool,
    rows: int | None,
    chunk: int,
    eps: float,
) -> torch.Tensor:
    """Random-feature attention with closed-form features and hand-written backward passes.

    Args:
        q: ``(..., N_q, d)``, in the accumulation dtype.
        k: ``(..., N_k, d)``.
        v: ``(..., N_k, Dv)``.
        key_mask: bool ``(..., N_k)``, True at padding, or None.
        query_form: the queries' features (``rf_features.ExponentialForm``).
        key_form: the keys' features.
        causal: query ``i`` attends to keys ``j <= i``.
        rows: rows per non-causal group; None: [`group_rows`][rf_attention._kernels.group_rows].
        chunk: positions per causal chunk.
        eps: relative guard of the normalizer.

    Returns:
        ``(..., N_q, Dv)``.
    """
    lead = q.shape[:-2]
    size = math.prod(lead)
    qs = feature_side(query_form, lead, q.dtype)
    ks = feature_side(key_form, lead, q.dtype)
    width = qs.offset.shape[-1]
    flat = [x.reshape(size, *x.shape[-2:]) for x in (q, k, v)]
    mask = None if key_mask is None else key_mask.reshape(size, key_mask.shape[-1])
    common = (qs.projection, qs.offset, ks.projection, ks.offset, qs.sign, qs.trigonometric)
    if causal:
        n = q.shape[-2]
        group = group_rows(
            n, q.shape[-1], width, multiple=min(chunk, n), per_element=CAUSAL_GROUP_FEATURES_PER_QUERY_ELEMENT
        )
        out = _Causal.apply(*flat, mask, *common, group, chunk, eps)
    else:
        query_rows = rows or group_rows(q.shape[-2], q.shape[-1], width)
        key_rows = rows or group_rows(k.shape[-2], k.shape[-1], width)
        out = _NonCausal.apply(*flat, mask, *common, query_rows, key_rows, eps)
    return out.reshape(*lead, *out.shape[-2:])
