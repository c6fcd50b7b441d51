"""Features inside the kernels: row/column stabilization, the closed forms and their hand-written VJPs.

A closed form (``rf_features.ExponentialForm``, every component of Section 3.2) gives
``phi(x) = exp([x, x * x] @ P + b) * sign [* (cos, sin) of phases]``; the kernels keep ``x`` and recompute
the features in the backward pass, whose vector-Jacobian products are written here.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F

from rf_attention.ops.common import FeatureFn, finite_or_zero
from rf_features import ExponentialForm


def qk_scale(head_dim: int) -> float:
    r"""$D_h^{-1/4}$, the factor of ``q`` and of ``k`` before the features.

    Then $\phi(q D_h^{-1/4}) \cdot \phi(k D_h^{-1/4}) \approx \exp(q \cdot k / \sqrt{D_h})$, the softmax
    kernel of ``scaled_dot_product_attention`` (Eq. 6).
    """
    return float(head_dim) ** -0.25


def exp_features(log_x: torch.Tensor, mult: torch.Tensor | None) -> torch.Tensor:
    """``exp(log_x) [* mult]``: features from ``FeatureFn``'s pair."""
    features = torch.exp(log_x)
    return features if mult is None else features * mult


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
    phi = exp_features(log_x - finite_or_zero(top), mult_x)
    if mask is not None:
        phi = phi.masked_fill(mask[..., None], 0.0)
    return phi, top.squeeze(-1), mult_x is not None


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


class ClosedFeatures(NamedTuple):
    """One group's features and what their VJP needs."""

    phi: torch.Tensor  # (G, n, m)
    squares: torch.Tensor  # (G, n, 2d): [x, x * x]


#: How a group's log-features are stabilized: by each row's maximum, each column's, or a given tensor.
Stabilizer = Literal["row", "column"] | torch.Tensor


def closed_form_features(
    x: torch.Tensor, side: FeatureSide, mask: torch.Tensor | None, stabilizer: Stabilizer
) -> tuple[ClosedFeatures, torch.Tensor]:
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
    phi = magnitude if waves is None else waves.mul_(magnitude)
    return ClosedFeatures(phi, squares), top


def closed_form_vjp(
    grad_phi: torch.Tensor, x: torch.Tensor, f: ClosedFeatures, side: FeatureSide
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of ``x (G, n, d)``, the projection and the offset from ``grad_phi (G, n, m)`` (overwritten).

    The stabilizers are constants (they cancel exactly in attention). Positive: ``dL = dphi * phi``.
    Trigonometric (``phi = M [cos theta, sin theta]``, one magnitude ``M`` per row and phase):
    ``dL = dphi * phi`` for the log-magnitude and ``dtheta = dphi_sin * phi_cos - dphi_cos * phi_sin``.
    """
    if not side.trigonometric:
        grad_u = grad_log = grad_phi.mul_(f.phi)
    else:
        r = f.phi.shape[-1] // 2
        grad_phase = grad_phi[..., r:] * f.phi[..., :r]
        grad_phase = grad_phase.addcmul_(grad_phi[..., :r], f.phi[..., r:], value=-1.0)
        grad_log = grad_phi.mul_(f.phi)
        grad_u = torch.cat((grad_phase, grad_log.sum(dim=-1, keepdim=True)), dim=-1)
    grad_squares = torch.bmm(grad_u, side.projection.mT)
    d = x.shape[-1]
    grad_x = torch.addcmul(grad_squares[..., :d], x, grad_squares[..., d:], value=2.0)
    return grad_x, torch.bmm(f.squares.mT, grad_u), grad_log.sum(dim=-2, keepdim=True)


def flat_sides(
    query_form: ExponentialForm, key_form: ExponentialForm, lead: torch.Size, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The kernel Functions' feature inputs: projections and offsets of both sides, query sign."""
    qs = feature_side(query_form, lead, dtype)
    ks = feature_side(key_form, lead, dtype)
    return qs.projection, qs.offset, ks.projection, ks.offset, qs.sign
