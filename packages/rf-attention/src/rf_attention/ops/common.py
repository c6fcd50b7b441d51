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

#: ``features(x, is_query) -> (log_features, multiplier)`` as ``FeatureMap.weighted_log_features``.
FeatureFn = Callable[[torch.Tensor, bool], tuple[torch.Tensor, torch.Tensor | None]]
#: Positions per chunk of the causal kernel (the intra-chunk products are ``chunk x chunk``).
DEFAULT_CHUNK_SIZE = 128
#: A group's features hold at most this many elements per element of ``q`` (the memory rule of the groups).
GROUP_FEATURES_PER_QUERY_ELEMENT = 1.0
#: The same for a causal group of the closed-form kernel: a causal group costs about twice the operations of a
#: non-causal one (chunk products and their VJPs), so it takes twice the rows (half the groups).
CAUSAL_GROUP_FEATURES_PER_QUERY_ELEMENT = 2.0
#: ... but a group of the closed-form kernel holds at least this many feature elements (1 MiB in float32):
#: short sequences run in few groups (per-operation overhead, not memory, bounds them).
MIN_GROUP_FEATURE_ELEMENTS = 2**18


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


def row_slices(n: int, rows: int) -> list[slice]:
    """Consecutive slices of ``rows`` rows covering ``n``."""
    return [slice(start, min(start + rows, n)) for start in range(0, n, rows)]


def recomputed(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``, its intermediate tensors recomputed in the backward pass instead of kept."""
    if not torch.is_grad_enabled():
        return function(*args)
    return checkpoint(function, *args, use_reentrant=False)


def mask_part(mask: torch.Tensor | None, part: slice) -> torch.Tensor | None:
    """The rows ``part`` of a padding mask ``(..., N)`` (None for None)."""
    return None if mask is None else mask[..., part]


def row_groups(x: torch.Tensor | None, rows: int, count: int) -> list[torch.Tensor | None]:
    """``count`` groups of ``rows`` rows (dim 1) of ``x`` by one ``split`` (all None for None)."""
    return [None] * count if x is None else list(x.split(rows, dim=1))


def accumulate(total: torch.Tensor | None, part: torch.Tensor) -> torch.Tensor:
    """``total + part``, ``part`` for a first ``total`` of None."""
    return part if total is None else total + part


def guard_gradient(
    out: torch.Tensor, den: torch.Tensor, free: torch.Tensor, grad_out: torch.Tensor
) -> torch.Tensor:
    """``d[numerator, normalizer]`` ``(G, n, Dv + 1)`` of ``out = numerator / den``.

    ``free``: where ``den`` is the normalizer itself (not replaced by the guard, which is a constant).
    """
    grad_num = grad_out / den
    grad_den = -(grad_num * out).sum(dim=-1, keepdim=True) * free
    return torch.cat((grad_num, grad_den), dim=-1)


class Gradients:
    """The gradients a kernel Function returns: ``q, k, v`` by groups, the feature sides summed."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: tuple[int, int]) -> None:
        self.q, self.k, self.v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self.q_parts = self.q.split(rows[0], dim=1)
        self.k_parts, self.v_parts = self.k.split(rows[1], dim=1), self.v.split(rows[1], dim=1)
        self.sides: list[torch.Tensor | None] = [None] * 4

    def side(self, index: int, projection: torch.Tensor, offset: torch.Tensor) -> None:
        """Add a group's gradients of a side's projection and offset (index 0: queries, 1: keys)."""
        self.sides[2 * index] = accumulate(self.sides[2 * index], projection)
        self.sides[2 * index + 1] = accumulate(self.sides[2 * index + 1], offset)

    def result(self) -> tuple[torch.Tensor | None, ...]:
        """In the order of the Functions' inputs (the non-tensor ones get None)."""
        return (self.q, self.k, self.v, None, *self.sides, *[None] * 5)
