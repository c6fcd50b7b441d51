"""Helpers every attention kernel shares: the normalizer's guard, the group rule, ``[v, 1]``, gradients.

The sequence is cut into a few *groups* of rows, as many as keep one group's features no larger than the
query tensor itself ([`group_rows`][rf_attention.ops.common.group_rows]): their number depends on the
feature width and the head dimension, never on N. Each group is one batched computation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from rf_features import LogFeatures

#: ``features(x, is_query) -> (log_features, multiplier)``, as a feature contract's ``log_features``.
FeatureFn = LogFeatures
#: Positions per chunk of the causal kernel (the intra-chunk products are ``chunk x chunk``).
DEFAULT_CHUNK_SIZE = 128
#: A group's features hold at most this many elements per element of ``q`` (the memory rule of the groups).
GROUP_FEATURES_PER_QUERY_ELEMENT = 1.0
#: The same for a causal group: its backward pass holds about fifteen feature-sized tensors at once (features,
#: [x, x * x], chunk x chunk products and weights, their VJPs), so it takes a fifth of the rows: the peak
#: memory of a causal forward+backward stays within 1.4x that of causal SDPA (measured at 8K and 32K).
CAUSAL_GROUP_FEATURES_PER_QUERY_ELEMENT = 0.2
#: ... but a group of the closed-form kernel holds at least this many feature elements (1 MiB in float32):
#: short sequences run in few groups (per-operation overhead, not memory, bounds them).
MIN_GROUP_FEATURE_ELEMENTS = 2**18


def guarded_denominator(
    den: torch.Tensor, bound: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The normalizer ``D`` made safe to divide by, and where it was changed.

    Positive features (``bound`` None): only a ``D`` of zero or below the dtype's smallest normal number
    changes (to 1; no key is seen, or the features underflowed: the numerator is as small). Signed
    features: ``|D| <= eps * bound`` with ``bound = |phi_q| . sum_j |phi_k_j| >= |D|`` becomes
    ``sign(D) eps bound`` (1 where that is below the smallest normal number): a relative guard, blind to
    the features' overall scale. A replaced ``D`` is a constant (no gradient). A subnormal ``D`` carries
    few significant bits, and the gradients of ``y / D`` (``1 / D``, ``y / D^2``) overflow to inf and NaN
    there; GPUs flush such values to zero anyway.

    Args:
        den: ``(..., N, 1)``.
        bound: ``(..., N, 1)`` or None.
        eps: relative size of the guard.
    """
    tiny = torch.finfo(den.dtype).tiny
    if bound is None:
        guarded = den < tiny
        return den.masked_fill(guarded, 1.0), guarded
    floor = eps * (bound.detach() if bound.requires_grad else bound)
    guarded = den.abs() <= floor.clamp_min(tiny)
    safe = torch.copysign(floor.masked_fill(floor < tiny, 1.0), den)
    return torch.where(guarded, safe, den), guarded


def finite_or_zero(x: torch.Tensor) -> torch.Tensor:
    """``x`` with ``-inf`` (an empty maximum: no key seen) replaced by 0; one operation."""
    return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


def with_ones(v: torch.Tensor) -> torch.Tensor:
    """``[v, 1]`` ``(..., n, Dv + 1)``: one product then gives numerator and normalizer together."""
    return F.pad(v, (0, 1), value=1.0)


def group_rows(
    n: int, dim: int, width: int, multiple: int = 1, per_element: float | None = None, batch: int = 0
) -> int:
    """Rows per group: the most whose ``width`` features hold no more elements than ``n`` rows of ``dim``.

    (times ``per_element``, default ``GROUP_FEATURES_PER_QUERY_ELEMENT``), or, given ``batch`` (the number
    of sequences), at least as many as make ``MIN_GROUP_FEATURE_ELEMENTS``. A multiple of ``multiple`` (the
    causal chunk), at least one ``multiple``. The number of groups, ``ceil(n / rows)``, is at most about
    ``width / (dim * per_element)`` whatever ``n``.
    """
    factor = GROUP_FEATURES_PER_QUERY_ELEMENT if per_element is None else per_element
    rows = int(n * dim * factor) // max(1, width) // multiple * multiple
    if batch:
        least = -(-MIN_GROUP_FEATURE_ELEMENTS // (batch * max(1, width)))
        rows = max(rows, -(-least // multiple) * multiple)
    return max(multiple, rows)


def causal_group_rows(n: int, dim: int, width: int, chunk: int, batch: int) -> int:
    """Rows per causal group: [`group_rows`][rf_attention.ops.common.group_rows] by the causal rule.

    ``CAUSAL_GROUP_FEATURES_PER_QUERY_ELEMENT``, a multiple of the chunk (``min(chunk, n)``).
    """
    return group_rows(n, dim, width, min(chunk, n), CAUSAL_GROUP_FEATURES_PER_QUERY_ELEMENT, batch=batch)


def recomputed(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``, its intermediate tensors recomputed in the backward pass instead of kept."""
    if not torch.is_grad_enabled():
        return function(*args)
    return checkpoint(function, *args, use_reentrant=False)


def row_groups(x: torch.Tensor | None, rows: int, count: int) -> list[torch.Tensor | None]:
    """``count`` groups of ``rows`` rows (dim 1) of ``x`` by one ``split`` (all None for None)."""
    return [None] * count if x is None else list(x.split(rows, dim=1))


def guard_gradient(
    out: torch.Tensor, den: torch.Tensor, free: torch.Tensor, grad_out: torch.Tensor
) -> torch.Tensor:
    """``d[numerator, normalizer]`` ``(G, n, Dv + 1)`` of ``out = numerator / den``.

    ``free``: where ``den`` is the normalizer itself (not replaced by the guard, which is a constant).
    """
    grad_num = grad_out / den
    grad_den = -(grad_num * out).sum(dim=-1, keepdim=True) * free
    return torch.cat((grad_num, grad_den), dim=-1)
