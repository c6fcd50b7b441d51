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


#: How a group's log-features are stabilized: by each row's maximum, each column's, or a given tensor.
Stabilizer = Literal["row", "column"] | torch.Tensor


def stabilized(
    log_x: torch.Tensor,
    mult: torch.Tensor | None,
    mask: torch.Tensor | None,
    stabilizer: Stabilizer,
    *,
    in_place: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Features ``exp(log_x - M) [* mult]`` ``(..., n, m)`` and the maximum ``M`` subtracted (detached).

    ``M`` is the rows' maxima ``(..., n, 1)``, the columns' ``(..., 1, m)`` or the given tensor; ``-inf``
    where every entry is padding, and 0 is subtracted there. Padded rows (``mask (..., n)``) are 0.
    ``in_place``: overwrite ``log_x`` (a fresh tensor that autograd does not record).

    Args:
        log_x: ``(..., n, r)`` log-features, ``r`` = ``m`` or 1 (one log-scale per row).
        mult: ``(..., n, m)`` multiplier (signs, waves, given features) or None.
        mask: bool ``(..., n)``, True at padding, or None.
        stabilizer: ``"row"``, ``"column"`` or the ``M`` to subtract.
        in_place: see above.
    """
    if mask is not None:
        fill = log_x.masked_fill_ if in_place else log_x.masked_fill
        log_x = fill(mask.unsqueeze(-1), -math.inf)
    if isinstance(stabilizer, torch.Tensor):
        top = stabilizer
    else:
        top = log_x.detach().amax(dim=-1 if stabilizer == "row" else -2, keepdim=True)
    if in_place:
        phi = log_x.sub_(finite_or_zero(top)).exp_()
        return (phi if mult is None else phi.mul_(mult)), top
    phi = torch.exp(log_x - finite_or_zero(top))
    return (phi if mult is None else phi * mult), top


def row_stabilized_features(
    features: FeatureFn, x: torch.Tensor, is_query: bool, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The features of ``x`` ``(..., n, m)``, each row divided by ``exp`` of its largest log-feature.

    Also returns that log-scale ``(..., n)`` (detached; ``-inf`` at padding, whose features are 0) and
    whether the features have signs.
    """
    log_x, mult_x = features(x, is_query)
    phi, top = stabilized(log_x, mult_x, mask, "row")
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


def closed_form_log_features(
    x: torch.Tensor, side: FeatureSide
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Log-features, multiplier (as a ``FeatureFn``'s) and ``[x, x * x]`` of ``x (G, n, d)``.

    Positive: ``[x, x * x] @ projection + offset`` and the sign. Trigonometric: the phases' waves
    ``[cos, sin]`` as the multiplier and one log-magnitude per row plus the offset.
    """
    squares = torch.cat((x, x * x), dim=-1)
    if not side.trigonometric:
        return torch.baddbmm(side.offset, squares, side.projection), side.sign, squares
    u = torch.bmm(squares, side.projection)
    phases = u[..., :-1]
    waves = torch.cat((phases.cos(), phases.sin()), dim=-1)
    mult = waves if side.sign is None else waves.mul_(side.sign)
    return u[..., -1:] + side.offset, mult, squares


def closed_form_features(
    x: torch.Tensor, side: FeatureSide, mask: torch.Tensor | None, stabilizer: Stabilizer
) -> tuple[ClosedFeatures, torch.Tensor]:
    """Features of ``x (G, n, d)``, ``exp(log - M) * sign [* waves]``, and the maximum ``M`` subtracted.

    [`closed_form_log_features`][rf_attention.ops.features.closed_form_log_features] through
    [`stabilized`][rf_attention.ops.features.stabilized], in place.
    """
    log_x, mult, squares = closed_form_log_features(x, side)
    phi, top = stabilized(log_x, mult, mask, stabilizer, in_place=True)
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


class ClosedForm(NamedTuple):
    """The feature strategy of maps with a closed form: both sides' ``FeatureSide`` s, hand-written VJPs."""

    query: FeatureSide
    key: FeatureSide

    @classmethod
    def of(
        cls, query_form: ExponentialForm, key_form: ExponentialForm, lead: torch.Size, dtype: torch.dtype
    ) -> ClosedForm:
        """Both sides of inputs with leading shape ``lead`` (flattened), in ``dtype``."""
        return cls(feature_side(query_form, lead, dtype), feature_side(key_form, lead, dtype))

    @property
    def signed(self) -> bool:
        """Whether the features have signs (waves or negative weights)."""
        return self.query.trigonometric or self.query.sign is not None

    def log_features(self, x: torch.Tensor, is_query: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The closed form as a ``FeatureFn``."""
        log_x, mult, _ = closed_form_log_features(x, self.query if is_query else self.key)
        return log_x, mult


#: A feature strategy: a closed form (hand-written VJPs) or any ``FeatureFn`` (autograd, recomputed groups).
Features = ClosedForm | FeatureFn


def flattened(features: FeatureFn, lead: torch.Size) -> FeatureFn:
    """``features`` of inputs ``(G, n, d)`` flattened from leading shape ``lead`` (``G = prod(lead)``).

    ``features`` sees ``(*lead, n, d)`` (its statistics broadcast over ``lead``); its outputs come back
    ``(G, n, .)`` (a multiplier without leading dimensions, such as a sign vector, as it is).
    """

    def flat(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None or t.dim() <= 2:
            return t
        return t.expand(*lead, *t.shape[-2:]).reshape(-1, *t.shape[-2:])

    def fn(x: torch.Tensor, is_query: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        log_x, mult = features(x.view(*lead, *x.shape[-2:]), is_query)
        flat_log = flat(log_x)
        assert flat_log is not None, "a tensor"
        return flat_log, flat(mult)

    return fn
