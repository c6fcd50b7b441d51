"""Features inside the kernels: row/column stabilization, the closed forms and their hand-written VJPs.

A closed form (``rf_features.ExponentialForm``, every component of Section 3.2) gives
``phi(x) = exp(x @ A^T + (x * x) @ g + b) * sign [* (cos, sin) of phases]``; the kernels keep ``x`` and
recompute the features in the backward pass, whose vector-Jacobian products are written here.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F

from rf_attention.ops.common import FeatureFn, finite_or_zero
from rf_features import ExponentialForm, FeatureContract


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
    ``in_place``: overwrite ``log_x`` (a fresh tensor that autograd does not record), and ``mult`` too
    where ``log_x`` has one column (then it must be such a tensor as well).

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
        if mult is None:
            return phi, top
        # one log-scale per row: the multiplier (then a fresh tensor too) takes the row factors
        return (mult.mul_(phi) if phi.shape[-1] == 1 else phi.mul_(mult)), top
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

    ``projection`` ``(G, d, m)`` multiplies ``x``: positive features, into ``m`` log-features;
    trigonometric, into the ``m/2`` phases laid out twice (``[A^T, A^T]``). ``wave_shift`` ``(1, 1, m)``
    (trigonometric only, else None) is 0 then ``-pi/2``: one ``cos`` of the shifted phases gives
    ``[cos, sin]``. ``square`` ``(G, d, 1)`` multiplies ``x * x`` into one log-term per row, shared by
    every feature (the ``-|x|^2 / 2``-like term of every component). ``offset`` ``(G, 1, m)``, ``sign``
    ``(m,)`` or None.
    """

    projection: torch.Tensor
    square: torch.Tensor
    offset: torch.Tensor
    sign: torch.Tensor | None
    wave_shift: torch.Tensor | None

    @property
    def trigonometric(self) -> bool:
        """Whether the features are waves (``[cos, sin]`` of the phases)."""
        return self.wave_shift is not None


def feature_side(form: ExponentialForm, lead: torch.Size, dtype: torch.dtype) -> FeatureSide:
    """``form`` for inputs of leading shape ``lead`` (flattened to ``G``), in ``dtype``."""
    a, g = form.matrix.to(dtype), form.square_weight.to(dtype)
    size = math.prod(lead)

    def per_input(t: torch.Tensor) -> torch.Tensor:
        return t.expand(*lead, *t.shape[-2:]).reshape(size, *t.shape[-2:])

    offset = form.offset.to(dtype)
    m = offset.shape[-1]
    offset = offset.expand(*lead, m).reshape(size, 1, m)
    sign = None if form.sign is None else form.sign.to(dtype)
    projection, shift = a.mT, None
    if form.trigonometric:
        projection = torch.cat((projection, projection), dim=-1)
        shift = F.pad(offset.new_full((1, 1, m // 2), -math.pi / 2), (m // 2, 0))
    return FeatureSide(per_input(projection), per_input(g.unsqueeze(-1)), offset, sign, shift)


class ClosedFeatures(NamedTuple):
    """One group's features and what their VJP needs."""

    phi: torch.Tensor  # (G, n, m)
    squares: torch.Tensor  # (G, n, d): x * x


def closed_form_log_features(
    x: torch.Tensor, side: FeatureSide
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Log-features, multiplier (as a ``FeatureFn``'s) and ``x * x`` of ``x (G, n, d)``.

    Positive: ``x @ projection + (x * x) @ square + offset`` and the sign. Trigonometric: one log-magnitude
    per row, ``(x * x) @ square + max(offset)`` ``(G, n, 1)``, and as the multiplier the waves
    ``cos(x @ projection + wave_shift)`` (``[cos, sin]`` of the phases) times
    ``exp(offset - max(offset)) [* sign]`` (at most 1): the same features, with no ``n x m``
    log-magnitude to add and exponentiate.
    """
    squares = x * x
    row = torch.bmm(squares, side.square)  # (G, n, 1)
    if side.wave_shift is None:
        return torch.baddbmm(side.offset, x, side.projection).add_(row), side.sign, squares
    top = side.offset.amax(dim=-1, keepdim=True)  # (G, 1, 1)
    factor = torch.exp(side.offset - top)
    waves = torch.baddbmm(side.wave_shift, x, side.projection).cos_()
    return row + top, waves.mul_(factor if side.sign is None else factor * side.sign), squares


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


#: Gradients of a side's ``x``, ``projection``, ``square`` and ``offset`` (the last three: None if not asked).
SideGradients = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]


def closed_form_vjp(
    grad_phi: torch.Tensor, x: torch.Tensor, f: ClosedFeatures, side: FeatureSide, *, parameters: bool = True
) -> SideGradients:
    """Gradients of ``x (G, n, d)`` and the side's tensors from ``grad_phi (G, n, m)`` (overwritten).

    The stabilizers are constants (they cancel exactly in attention). Positive: ``dL = dphi * phi``.
    Trigonometric (``phi = M [cos theta, sin theta] = M cos(theta')``, ``theta' = [theta, theta - pi/2]``,
    one magnitude ``M`` per row and phase): ``dL = dphi * phi`` for the log-magnitude and
    ``dtheta' = dphi * [-phi_sin, phi_cos]``.
    The row term's gradient is ``dL`` summed over the features. ``parameters=False``: the projection's,
    square's and offset's are not computed (None; nothing asks for them).
    """
    if not side.trigonometric:
        grad_u = grad_log = grad_phi.mul_(f.phi)
    else:
        r = f.phi.shape[-1] // 2
        swapped = f.phi.roll(r, dims=-1)  # [phi_sin, phi_cos]
        swapped[..., :r].neg_()
        grad_u = swapped.mul_(grad_phi)
        grad_log = grad_phi.mul_(f.phi)
    grad_row = grad_log.sum(dim=-1, keepdim=True)  # (G, n, 1)
    grad_x = torch.bmm(grad_u, side.projection.mT).addcmul_(x * grad_row, side.square.mT, value=2.0)
    if not parameters:
        return grad_x, None, None, None
    grad_projection = torch.bmm(x.mT, grad_u)
    grad_square = torch.bmm(f.squares.mT, grad_row)
    return grad_x, grad_projection, grad_square, grad_log.sum(dim=-2, keepdim=True)


class ClosedForm(NamedTuple):
    """The feature strategy of maps with a closed form: both sides' ``FeatureSide`` s, hand-written VJPs."""

    query: FeatureSide
    key: FeatureSide

    @classmethod
    def of(cls, contract: FeatureContract, lead: torch.Size, dtype: torch.dtype) -> ClosedForm:
        """Both sides of a closed-form contract for inputs of leading shape ``lead`` (flattened)."""
        assert contract.query is not None, "a closed-form contract"
        assert contract.key is not None, "a closed-form contract"
        return cls(feature_side(contract.query, lead, dtype), feature_side(contract.key, lead, dtype))

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


def feature_strategy(contract: FeatureContract, lead: torch.Size, dtype: torch.dtype) -> Features:
    """The kernels' strategy for a feature map's contract: its ``ClosedForm`` or its callable.

    The ``ClosedForm`` takes inputs of leading shape ``lead`` flattened (in ``dtype``), the ``log_features``
    callable inputs ``(*lead, n, d)``.
    """
    if contract.closed:
        return ClosedForm.of(contract, lead, dtype)
    assert contract.log_features is not None, "a contract holds one strategy"
    return contract.log_features


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
