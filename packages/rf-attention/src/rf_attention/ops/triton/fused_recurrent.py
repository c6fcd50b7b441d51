# mypy: disable-error-code="import-untyped,untyped-decorator,no-untyped-def"
# (Triton ships no type information, and its kernels take untyped pointers and constexprs.)
r"""One decoding step of causal RF attention as one Triton kernel: the state update and the output.

The state is [`RecurrentState`][rf_attention.ops.recurrent.RecurrentState]'s: sums
$e^{-R} \sum_j \phi_{k_j}^\top [v_j, 1]$ ``(G, m, Dv + 1)``, the log-scale $R$ and, for signed
features, $e^{-R} \sum_j |\phi_{k_j}|$. One program per sequence computes the new key's features (divided
by $e^{c}$, $c$ their largest log-feature), moves the sums to $R' = \max(R, c)$
($e^{R - R'} \le 1$, $e^{c - R'} \le 1$), adds the key and reads the query against the new sums with the
normalizer's guard: the same formula as the causal kernels (stabilizers that cancel exactly).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rf_attention.ops.features import ClosedForm, FeatureSide
from rf_attention.ops.triton._features import KernelSide, block, finite, guard, load_side

#: Warps per program.
NUM_WARPS = 4
#: Launch options: the warps, and fused multiply-adds (named: Triton warns while its default is unset).
LAUNCH = {"num_warps": NUM_WARPS, "enable_fp_fusion": True}


@triton.jit
def _row_log_features(x, valid, proj, square, offset, sign, shift, TRIG: tl.constexpr):
    """``(L, multiplier)`` ``(BM,)`` of one row ``x (BD,)``; ``L = -inf`` unless ``valid``."""
    u = tl.sum(x[:, None] * proj, axis=0)
    r = tl.sum(x * x * square, axis=0)
    if TRIG:
        log = r + offset
        mult = tl.cos(u + shift) * sign
    else:
        log = u + r + offset
        mult = sign + tl.zeros_like(u)
    return tl.where(valid, log, float("-inf")), mult


@triton.jit
def fused_recurrent_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr,
    qp_ptr, qsq_ptr, qo_ptr, qsg_ptr, qsh_ptr, kp_ptr, ksq_ptr, ko_ptr, ksg_ptr, ksh_ptr,
    sums_ptr, scale_ptr, mag_ptr, out_ptr, new_sums_ptr, new_scale_ptr, new_mag_ptr,
    d, m, dv, eps, mask_group, mask_stride,
    BD: tl.constexpr, BM: tl.constexpr, BW: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_SIGN: tl.constexpr, TRIG: tl.constexpr,
):  # fmt: skip
    """One token of one sequence: the new sums ``(m, Dv + 1)``, log-scale, magnitudes and output ``(Dv,)``.

    Sequence ``g`` reads the mask's entry ``g // mask_group`` (``mask_stride`` apart).
    """
    g = tl.program_id(0)
    q_proj, q_square, q_offset, q_sign, q_shift = load_side(
        qp_ptr, qsq_ptr, qo_ptr, qsg_ptr, qsh_ptr, g, d, m, BD, BM, HAS_SIGN, TRIG
    )
    k_proj, k_square, k_offset, k_sign, k_shift = load_side(
        kp_ptr, ksq_ptr, ko_ptr, ksg_ptr, ksh_ptr, g, d, m, BD, BM, False, TRIG
    )
    rd = tl.arange(0, BD)
    rm = tl.arange(0, BM)
    rv = tl.arange(0, BW)  # the values, then the normalizer's column
    xq = tl.load(q_ptr + g * d + rd, mask=rd < d, other=0.0).to(tl.float32)
    xk = tl.load(k_ptr + g * d + rd, mask=rd < d, other=0.0).to(tl.float32)
    val = tl.load(v_ptr + g * dv + rv, mask=rv < dv, other=0.0).to(tl.float32)
    val = tl.where(rv == dv, 1.0, val)  # [v, 1]
    valid = rm >= 0
    if HAS_MASK:
        valid = valid & (tl.load(mask_ptr + (g // mask_group) * mask_stride) == 0)
    log_k, mult_k = _row_log_features(xk, valid, k_proj, k_square, k_offset, k_sign, k_shift, TRIG)
    key_scale = tl.max(log_k, axis=0)
    phi_k = tl.exp(log_k - finite(key_scale)) * mult_k
    reference = tl.load(scale_ptr + g)
    new_reference = tl.maximum(reference, key_scale)
    safe = finite(new_reference)
    decay = tl.exp(reference - safe)
    weighted = phi_k * tl.exp(key_scale - safe)
    state_mask = (rm[:, None] < m) & (rv[None, :] <= dv)
    offsets = (g * m + rm[:, None]) * (dv + 1) + rv[None, :]
    sums = tl.load(sums_ptr + offsets, mask=state_mask, other=0.0) * decay + weighted[:, None] * val[None, :]
    log_q, mult_q = _row_log_features(xq, rm < m, q_proj, q_square, q_offset, q_sign, q_shift, TRIG)
    phi_q = tl.exp(log_q - finite(tl.max(log_q, axis=0))) * mult_q
    y = tl.sum(phi_q[:, None] * sums, axis=0)  # (BW,): numerator, then normalizer
    den = tl.sum(tl.where(rv == dv, y, 0.0), axis=0)
    bound = den
    if TRIG or HAS_SIGN:
        mag = tl.load(mag_ptr + g * m + rm, mask=rm < m, other=0.0) * decay + tl.abs(weighted)
        tl.store(new_mag_ptr + g * m + rm, mag, mask=rm < m)
        bound = tl.sum(tl.abs(phi_q) * mag, axis=0)
    den, _ = guard(den, bound, eps, TRIG or HAS_SIGN)
    tl.store(out_ptr + g * dv + rv, y / den, mask=rv < dv)
    tl.store(new_sums_ptr + offsets, sums, mask=state_mask)
    tl.store(new_scale_ptr + g, new_reference)


@dataclass(frozen=True)
class KernelLayout:
    """Both sides of a closed form as the step kernel reads them, for ``size`` sequences.

    Built once per decoding state and kept on it
    ([`RecurrentState`][rf_attention.ops.recurrent.RecurrentState]'s ``layout``) while the map does not
    change, so that a step launches the kernel and nothing else.

    Attributes:
        query: the query side (with its sign).
        key: the key side (signs cancel in the normalizer: none).
        version: what it was built from (the map's tensors' versions, dtype, input scale, ``size``).
    """

    query: KernelSide
    key: KernelSide
    version: tuple[object, ...]

    @classmethod
    def of(cls, closed: ClosedForm, size: int, version: tuple[object, ...] = ()) -> KernelLayout:
        """``closed`` (the features of ``size`` sequences) laid out for the kernel."""
        key = FeatureSide(*closed.key[:3], None, closed.key.wave_shift)
        return cls(KernelSide(closed.query, size), KernelSide(key, size), version)


def fused_recurrent_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    closed: ClosedForm | KernelLayout,
    sums: torch.Tensor,
    log_scale: torch.Tensor,
    magnitude: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One token: ``q, k (..., 1, d)``, ``v (..., 1, Dv)`` and the state's tensors (``G`` sequences in all).

    The state is [`RecurrentState`][rf_attention.ops.recurrent.RecurrentState]'s: ``sums (..., m, Dv + 1)``,
    ``log_scale (..., 1, 1)`` and, for signed features, ``magnitude (..., m, 1)``.

    ``key_padding_mask`` bool ``(G,)``, or ``(B,)`` for ``G = B H`` (one entry per ``H`` consecutive
    sequences, as ``(B, H)`` leads), True where the token is padding (its key is not added), or None;
    ``closed`` the features of the ``G`` sequences (``q`` and ``k`` scaled as the closed form expects),
    or them laid out already; ``eps`` the normalizer's relative guard. Returns the output ``(..., 1, Dv)``
    in ``v``'s dtype and the state's tensors after the token (new tensors, float32, shaped as given;
    ``magnitude`` None for positive features).
    """
    lead, d, dv = q.shape[:-2], q.shape[-1], v.shape[-1]
    size = q[..., 0, 0].numel()
    layout = KernelLayout.of(closed, size) if isinstance(closed, ClosedForm) else closed
    qs, ks = layout.query, layout.key
    signed = qs.trigonometric or qs.has_sign
    if signed and magnitude is None:
        raise ValueError(
            "state: signed features need the state's magnitude (RecurrentState.empty(signed=True))"
        )
    m = qs.m
    sums = sums.reshape(size, m, dv + 1).float().contiguous()
    scale = log_scale.reshape(size).float().contiguous()
    mag = sums if magnitude is None else magnitude.reshape(size, m).float().contiguous()
    mask = None if key_padding_mask is None else key_padding_mask.reshape(-1).view(torch.uint8)  # no copy
    group, stride = (1, 1) if mask is None else (size // mask.numel(), mask.stride(0))
    out = torch.empty(size, dv, device=q.device, dtype=v.dtype)  # the store rounds
    new_sums, new_scale = torch.empty_like(sums), torch.empty_like(scale)
    new_mag = torch.empty(size, m, device=q.device) if signed else new_sums
    fused_recurrent_kernel[(size,)](
        q.reshape(size, d).contiguous(), k.reshape(size, d).contiguous(), v.reshape(size, dv).contiguous(),
        scale if mask is None else mask, *qs.args(), *ks.args(), sums, scale, mag, out, new_sums, new_scale,
        new_mag, d, m, dv, eps, group, stride, BD=block(d), BM=block(m), BW=triton.next_power_of_2(dv + 1),
        HAS_MASK=mask is not None, HAS_SIGN=qs.has_sign, TRIG=qs.trigonometric, **LAUNCH,
    )  # fmt: skip
    return (
        out.reshape(*lead, 1, dv),
        new_sums.reshape(*lead, m, dv + 1),
        new_scale.reshape(*lead, 1, 1),
        new_mag.reshape(*lead, m, 1) if signed else None,
    )
