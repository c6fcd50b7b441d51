"""Chunk-parallel random-feature attention: a fixed number of batched operations per call, whatever N.

The sequence is cut into a few *groups* of rows, as many as keep one group's features no larger than the
query tensor itself (``group_rows``): their number depends on the feature width and the head dimension,
never on N. Each group is one batched computation:

- non-causal (Eq. 7): a group of keys gives its ``m x (Dv + 1)`` sums ``phi_k^T [v, 1]`` by one matmul; a
  group of queries reads them by one matmul;
- causal: a group is cut into chunks of ``chunk`` positions, all processed at once: per-chunk key sums by
  one batched matmul, the state entering every chunk by one ``T x T`` decay-weighted prefix sum over the
  chunks (one batched matmul), the intra-chunk masked products by batched ``chunk x chunk`` matmuls. The
  state leaving a group enters the next.

Each group runs under ``torch.utils.checkpoint``: autograd keeps ``q, k, v``, the ``m x (Dv + 1)`` sums
passed between groups and the outputs, and recomputes a group's features in the backward pass, so the
``N x m`` feature tensors live one group at a time. The backward pass is autograd's through the same
operations (gradients of the plain formula ``phi_q (phi_k^T v) / (phi_q phi_k^T 1)``; the stabilizers are
detached constants that cancel exactly), and the whole computation traces under ``torch.compile``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

#: ``features(x, is_query) -> (log_features, multiplier)`` as ``FeatureMap.weighted_log_features``.
FeatureFn = Callable[[torch.Tensor, bool], tuple[torch.Tensor, torch.Tensor | None]]
#: Positions per chunk of the causal kernel (the intra-chunk products are ``chunk x chunk``).
DEFAULT_CHUNK_SIZE = 128
#: A group's features hold at most this many elements per element of ``q`` (the memory rule of the groups).
GROUP_FEATURES_PER_QUERY_ELEMENT = 1.0


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


def group_rows(n: int, dim: int, width: int, multiple: int = 1) -> int:
    """Rows per group: the most whose ``width`` features hold no more elements than ``n`` rows of ``dim``.

    A multiple of ``multiple`` (the causal chunk), at least one ``multiple``. The number of groups,
    ``ceil(n / rows)``, is about ``width / dim`` whatever ``n``.
    """
    rows = int(n * dim * GROUP_FEATURES_PER_QUERY_ELEMENT) // max(1, width)
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
    c = min(chunk, n)
    t = -(-n // c)
    pad = t * c - n
    v_ones = with_ones(v)
    if pad:
        phi_q, phi_k, v_ones = (F.pad(x, (0, 0, 0, pad)) for x in (phi_q, phi_k, v_ones))
        key_log_scale = F.pad(key_log_scale, (0, pad), value=-math.inf)
    w = v_ones.shape[-1]
    if reference is None:
        reference = phi_q.new_full(lead, -math.inf)
    track_magnitude = signed or magnitude is not None
    # references: R_i per position, E_t per chunk end, and the one entering each chunk (and the final one)
    refs = torch.maximum(torch.cummax(key_log_scale, dim=-1).values, reference.unsqueeze(-1))
    safe_refs = finite_or_zero(refs).view(*lead, t, c)
    ends = refs.view(*lead, t, c)[..., -1]
    entering = torch.cat((reference.unsqueeze(-1), ends), dim=-1)  # (..., t + 1)
    safe_entering = finite_or_zero(entering)
    pq = phi_q.reshape(*lead, t, c, m)
    pk = phi_k.reshape(*lead, t, c, m)
    pv = v_ones.reshape(*lead, t, c, w)
    scales = key_log_scale.view(*lead, t, c)
    # per-chunk key sums relative to the chunk's end reference
    chunk_sums, chunk_magnitudes = weighted_key_sums(pk, scales, pv, finite_or_zero(ends))
    # prefix over chunks: row r (0..t) is the state entering chunk r (r = t: after the block)
    # only u < r counts (tril); there E_u <= E_{r-1}, elsewhere the exponent is clamped (then zeroed)
    decay = (ends.unsqueeze(-2) - safe_entering.unsqueeze(-1)).clamp_max(0).exp().tril(-1)
    carried = torch.exp(reference.unsqueeze(-1) - safe_entering)  # (..., t + 1), 0 for an empty state
    states = decay @ chunk_sums.flatten(-2)
    if state is not None:
        states = states + carried.unsqueeze(-1) * state.flatten(-2).unsqueeze(-2)
    states = states.unflatten(-1, (m, w))
    magnitudes = None
    if track_magnitude:
        magnitudes = decay @ chunk_magnitudes
        if magnitude is not None:
            magnitudes = magnitudes + carried.unsqueeze(-1) * magnitude.unsqueeze(-2)
    # queries: the state entering their chunk, weighed exp(E_{t-1} - R_i), and the keys j <= i of the chunk
    carry = torch.exp(entering[..., :-1].unsqueeze(-1) - safe_refs).unsqueeze(-1)  # (..., t, c, 1)
    weights = (scales.unsqueeze(-2) - safe_refs.unsqueeze(-1)).clamp_max(0).exp().tril()  # j <= i
    scores = (pq @ pk.mT) * weights
    y = carry * (pq @ states[..., :-1, :, :]) + scores @ pv
    bound = None
    if signed:
        assert magnitudes is not None, "tracked with the states"
        abs_q = pq.detach().abs()
        inside = ((abs_q @ pk.detach().abs().mT) * weights).sum(dim=-1, keepdim=True)
        bound = carry * (abs_q @ magnitudes[..., :-1, :].detach().unsqueeze(-1)) + inside
    den, _ = guarded_denominator(y[..., -1:], bound, eps)
    out = (y[..., :-1] / den).reshape(*lead, t * c, w - 1)
    if pad:
        out = out[..., :n, :]
    final_magnitude = None if magnitudes is None else magnitudes[..., -1, :]
    return out, states[..., -1, :, :], final_magnitude, entering[..., -1]


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
