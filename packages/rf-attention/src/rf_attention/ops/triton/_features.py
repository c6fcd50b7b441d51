# mypy: disable-error-code="import-untyped,untyped-decorator,no-untyped-def"
# (Triton ships no type information, and its kernels take untyped pointers and constexprs.)
"""The closed-form features inside a Triton kernel, their VJP and the normalizer's guard.

Features of a block of rows ``x (BN, BD)`` (Section 3.2, ``rf_features.ExponentialForm``):
``L = x @ projection + (x * x) @ square + offset`` (positive) or ``(x * x) @ square + offset`` with the
multiplier ``cos(x @ projection + wave_shift)`` (trigonometric: ``[cos, sin]`` of the phases), times the
sign; ``phi = exp(L - M) * multiplier`` with ``M`` a stabilizer chosen by the kernel. Padded feature
columns have ``offset = -inf`` (so ``L = -inf`` and ``phi = 0``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rf_attention.ops.features import FeatureSide

NEG_INF = tl.constexpr(float("-inf"))
#: float32's smallest normal number: a normalizer below it counts as zero (the guard).
FLOAT32_TINY = tl.constexpr(torch.finfo(torch.float32).tiny)
#: Precision of every ``tl.dot``: three TF32 products per float32 product (float32's accuracy, tensor cores).
DOT_PRECISION = tl.constexpr("tf32x3")


def block(n: int) -> int:
    """The power-of-two block that holds ``n`` (at least 16: ``tl.dot``'s smallest operand)."""
    return max(16, triton.next_power_of_2(n))


class KernelSide:
    """A ``FeatureSide`` as the kernels read it: contiguous float32 ``(G, d, m)``, ``(G, d)``, ``(G, m)``.

    ``sign`` ``(m,)`` and ``shift`` ``(m,)`` are dummies (``offset``) where the side has none.
    """

    def __init__(self, side: FeatureSide, size: int, offset: torch.Tensor | None = None) -> None:
        d, m = side.projection.shape[-2:]
        self.projection = side.projection.float().expand(size, d, m).contiguous()
        self.square = side.square.float().expand(size, d, 1).reshape(size, d).contiguous()
        given = side.offset if offset is None else offset
        self.offset = given.float().expand(size, 1, m).reshape(size, m).contiguous()
        self.has_sign = side.sign is not None
        self.trigonometric = side.wave_shift is not None
        self.sign = self.offset if side.sign is None else side.sign.float().reshape(m).contiguous()
        self.shift = (
            self.offset if side.wave_shift is None else side.wave_shift.float().reshape(m).contiguous()
        )
        self.d, self.m = d, m

    def args(self) -> tuple[torch.Tensor, ...]:
        """The pointer arguments of ``load_side``."""
        return self.projection, self.square, self.offset, self.sign, self.shift


@triton.jit
def load_side(
    proj_ptr, square_ptr, offset_ptr, sign_ptr, shift_ptr, g, d, m,
    BD: tl.constexpr, BM: tl.constexpr, HAS_SIGN: tl.constexpr, TRIG: tl.constexpr,
):  # fmt: skip
    """Sequence ``g``'s side: projection ``(BD, BM)``, square ``(BD,)``, offset, sign, shift ``(BM,)``."""
    rd = tl.arange(0, BD)
    rm = tl.arange(0, BM)
    proj = tl.load(
        proj_ptr + g * d * m + rd[:, None] * m + rm[None, :],
        mask=(rd[:, None] < d) & (rm[None, :] < m),
        other=0.0,
    )
    square = tl.load(square_ptr + g * d + rd, mask=rd < d, other=0.0)
    offset = tl.load(offset_ptr + g * m + rm, mask=rm < m, other=NEG_INF)
    sign = tl.full((BM,), 1.0, tl.float32)
    if HAS_SIGN:
        sign = tl.load(sign_ptr + rm, mask=rm < m, other=0.0)
    shift = tl.zeros((BM,), tl.float32)
    if TRIG:
        shift = tl.load(shift_ptr + rm, mask=rm < m, other=0.0)
    return proj, square, offset, sign, shift


@triton.jit
def log_features(x, valid, proj, square, offset, sign, shift, TRIG: tl.constexpr):
    """``(L, multiplier, phase)`` ``(BN, BM)`` of rows ``x (BN, BD)``; ``L = -inf`` where not ``valid``."""
    u = tl.dot(x, proj, input_precision=DOT_PRECISION)
    r = tl.sum(x * x * square[None, :], axis=1)
    if TRIG:
        log = r[:, None] + offset[None, :]
        mult = tl.cos(u + shift[None, :]) * sign[None, :]
    else:
        log = u + r[:, None] + offset[None, :]
        mult = tl.zeros_like(u) + sign[None, :]
    log = tl.where(valid[:, None], log, NEG_INF)
    return log, mult, u


@triton.jit
def finite(x):
    """``x`` with ``-inf`` (an empty maximum) replaced by 0."""
    return tl.where(x == NEG_INF, 0.0, x)


@triton.jit
def features_vjp(grad_phi, phi, magnitude, x, u, proj, square, sign, shift, TRIG: tl.constexpr):
    """Gradients of ``x`` ``(BN, BD)``, of the phases ``u`` and of ``L`` ``(BN, BM)``, and ``L``'s row sums.

    ``phi = magnitude * multiplier``, ``magnitude = exp(L - M)`` (``M`` a constant). Positive: the phase is
    part of ``L``, so ``du = dL = dphi * phi``. Trigonometric:
    ``du = -dphi * magnitude * sign * sin(u + shift)``.
    """
    grad_log = grad_phi * phi
    if TRIG:  # noqa: SIM108  (a constexpr branch)
        grad_u = -grad_phi * magnitude * sign[None, :] * tl.sin(u + shift[None, :])
    else:
        grad_u = grad_log
    row = tl.sum(grad_log, axis=1)
    grad_x = (
        tl.dot(grad_u, tl.trans(proj), input_precision=DOT_PRECISION)
        + 2.0 * x * row[:, None] * square[None, :]
    )
    return grad_x, grad_u, grad_log, row


@triton.jit
def guard(den, bound, eps, SIGNED: tl.constexpr):
    """The normalizer made safe to divide by, and 1.0 where it is the normalizer itself (else 0.0).

    As ``rf_attention.ops.common.guarded_denominator``: positive features change only a ``den`` of zero or
    below float32's smallest normal number (to 1); signed ones ``|den| <= eps * bound`` (or below that
    number) to ``sign(den) eps bound`` (1 where that is below it).
    """
    if SIGNED:
        floor = eps * bound
        guarded = tl.abs(den) <= tl.maximum(floor, FLOAT32_TINY)
        safe = tl.where(floor < FLOAT32_TINY, 1.0, floor)
        safe = tl.where(den < 0, -safe, safe)
    else:
        guarded = den < FLOAT32_TINY
        safe = tl.full(den.shape, 1.0, tl.float32)
    return tl.where(guarded, safe, den), tl.where(guarded, 0.0, 1.0)


@triton.jit
def load_rows(ptr, g, n, rn, inside, width, BW: tl.constexpr):
    """Rows ``rn`` of sequence ``g`` of a ``(G, n, width)`` tensor: a float32 ``(BN, BW)`` (0 outside)."""
    rw = tl.arange(0, BW)
    mask = inside[:, None] & (rw[None, :] < width)
    return tl.load(ptr + (g * n + rn[:, None]) * width + rw[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def store_rows(ptr, value, g, n, rn, inside, width, BW: tl.constexpr):
    """``value (BN, BW)`` into rows ``rn`` of sequence ``g`` of a ``(G, n, width)`` tensor (inside only)."""
    rw = tl.arange(0, BW)
    tl.store(
        ptr + (g * n + rn[:, None]) * width + rw[None, :], value, mask=inside[:, None] & (rw[None, :] < width)
    )


@triton.jit
def valid_keys(mask_ptr, g, n, rn, inside, HAS_MASK: tl.constexpr):
    """``(BN,)``: inside the sequence and, with a key padding mask ``(G, n)``, not padding."""
    valid = inside
    if HAS_MASK:
        valid = valid & (tl.load(mask_ptr + g * n + rn, mask=inside, other=1) == 0)
    return valid


@triton.jit
def output_grads(grad_out_ptr, out_ptr, den_ptr, free_ptr, g, n, rn, inside, dv, BV: tl.constexpr):
    """Gradients of rows ``rn``'s numerators ``(BN, BV)`` and normalizers ``(BN,)`` (the guard's are 0)."""
    grad = load_rows(grad_out_ptr, g, n, rn, inside, dv, BV)
    out = load_rows(out_ptr, g, n, rn, inside, dv, BV)
    den = tl.load(den_ptr + g * n + rn, mask=inside, other=1.0)
    free = tl.load(free_ptr + g * n + rn, mask=inside, other=0.0)
    grad_num = grad / den[:, None]
    return grad_num, -tl.sum(grad_num * out, axis=1) * free


@triton.jit
def add_side_grads(grad_proj, grad_square, grad_offset, x, grad_u, grad_log, row):
    """A block's share ``(features_vjp``'s outputs) added to a side's projection, square, offset gradients."""
    grad_proj += tl.dot(tl.trans(x), grad_u, input_precision=DOT_PRECISION)
    grad_square += tl.sum(x * x * row[:, None], axis=0)
    grad_offset += tl.sum(grad_log, axis=0)
    return grad_proj, grad_square, grad_offset


@triton.jit
def store_side_grads(
    grad_proj, grad_square, grad_offset, grad_proj_ptr, grad_square_ptr, grad_offset_ptr, base, d, m,
    BD: tl.constexpr, BM: tl.constexpr,
):  # fmt: skip
    """One program's share of a side's gradients: row ``base`` of ``(P, d, m)``, ``(P, d)``, ``(P, m)``."""
    rd = tl.arange(0, BD)
    rm = tl.arange(0, BM)
    tl.store(grad_proj_ptr + (base * d + rd[:, None]) * m + rm[None, :], grad_proj,
             mask=(rd[:, None] < d) & (rm[None, :] < m))  # fmt: skip
    tl.store(grad_square_ptr + base * d + rd, grad_square, mask=rd < d)
    tl.store(grad_offset_ptr + base * m + rm, grad_offset, mask=rm < m)
