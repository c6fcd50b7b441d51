# mypy: disable-error-code="import-untyped,untyped-decorator,no-untyped-def"
# (Triton ships no type information, and its kernels take untyped pointers and constexprs.)
r"""The non-causal Triton kernel (Eq. 7): key sums by column-stabilized features, then the queries' rows.

Forward: ``key_sums`` (grid: sequences x splits of the keys) runs over its keys block by block, keeping
``phi_k^T v``, ``phi_k^T 1`` and ``sum |phi_k|`` relative to the running column maxima ``M`` of the
log-features (an online rescale by ``exp(M_old - M_new) <= 1``); the splits are combined by their maxima
in PyTorch (as the PyTorch path's groups), and the reference ``M`` moves to the query side (folded into
the query offset). ``query_outputs`` (grid: sequences x query blocks) divides each query row by its
largest entry and applies the normalizer and its guard. Backward: ``query_grads`` (gradients of ``q``,
of the state and of the query side) then ``key_grads`` (``k``, ``v`` and the key side), features
recomputed from the saved inputs.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from rf_attention.ops.common import finite_or_zero
from rf_attention.ops.features import ClosedForm
from rf_attention.ops.triton._features import (
    DOT_PRECISION,
    KernelSide,
    add_side_grads,
    block,
    features_vjp,
    finite,
    guard,
    load_rows,
    load_side,
    log_features,
    output_grads,
    store_rows,
    store_side_grads,
    valid_keys,
)

#: Rows of a block.
BLOCK_ROWS = 32
#: Warps per program.
NUM_WARPS = 4
#: Launch options: the warps, and fused multiply-adds (named: Triton warns while its default is unset).
LAUNCH = {"num_warps": NUM_WARPS, "enable_fp_fusion": True}
#: Programs the key and backward kernels aim at per launch (splits of each sequence): a few per SM.
TARGET_PROGRAMS = 512


def _splits(size: int, n: int) -> tuple[int, int]:
    """``(splits, rows per split)`` of ``n`` rows of ``size`` sequences (rows a multiple of a block)."""
    blocks = triton.cdiv(n, BLOCK_ROWS)
    splits = min(blocks, max(1, triton.cdiv(TARGET_PROGRAMS, size)))
    rows = triton.cdiv(blocks, splits) * BLOCK_ROWS
    return triton.cdiv(n, rows), rows


@triton.jit
def key_sums_kernel(
    k_ptr, v_ptr, mask_ptr, proj_ptr, square_ptr, offset_ptr, sign_ptr, shift_ptr,
    sums_ptr, norm_ptr, mag_ptr, top_ptr,
    n, d, m, dv, rows,
    BN: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BV: tl.constexpr,
    HAS_MASK: tl.constexpr, TRIG: tl.constexpr,
):  # fmt: skip
    """One split's ``phi_k^T v (BM, BV)``, ``phi_k^T 1``, ``sum |phi_k|``, relative to its column maxima."""
    g = tl.program_id(0)
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    rv = tl.arange(0, BV)
    rm = tl.arange(0, BM)
    sums = tl.zeros((BM, BV), tl.float32)
    norm = tl.zeros((BM,), tl.float32)
    mag = tl.zeros((BM,), tl.float32)
    top = tl.full((BM,), float("-inf"), tl.float32)
    lo = split * rows
    hi = tl.minimum(lo + rows, n)
    for start in range(lo, hi, BN):
        proj, square, offset, sign, shift = load_side(
            proj_ptr, square_ptr, offset_ptr, sign_ptr, shift_ptr, g, d, m, BD, BM, False, TRIG
        )
        rn = start + tl.arange(0, BN)
        inside = rn < hi
        x = load_rows(k_ptr, g, n, rn, inside, d, BD)
        val = load_rows(v_ptr, g, n, rn, inside, dv, BV)
        valid = valid_keys(mask_ptr, g, n, rn, inside, HAS_MASK)
        log, mult, _ = log_features(x, valid, proj, square, offset, sign, shift, TRIG)
        new_top = tl.maximum(top, tl.max(log, axis=0))
        reference = finite(new_top)
        decay = tl.exp(top - reference)
        phi = tl.exp(log - reference[None, :]) * mult
        sums = sums * decay[:, None] + tl.dot(tl.trans(phi), val, input_precision=DOT_PRECISION)
        norm = norm * decay + tl.sum(phi, axis=0)
        mag = mag * decay + tl.sum(tl.abs(phi), axis=0)
        top = new_top
    base = g * splits + split
    tl.store(
        sums_ptr + (base * m + rm[:, None]) * dv + rv[None, :],
        sums,
        mask=(rm[:, None] < m) & (rv[None, :] < dv),
    )
    tl.store(norm_ptr + base * m + rm, norm, mask=rm < m)
    tl.store(mag_ptr + base * m + rm, mag, mask=rm < m)
    tl.store(top_ptr + base * m + rm, top, mask=rm < m)


@triton.jit
def query_outputs_kernel(
    q_ptr, proj_ptr, square_ptr, offset_ptr, sign_ptr, shift_ptr,
    sums_ptr, norm_ptr, mag_ptr, out_ptr, den_ptr, free_ptr,
    n, d, m, dv, eps,
    BN: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BV: tl.constexpr,
    HAS_SIGN: tl.constexpr, TRIG: tl.constexpr,
):  # fmt: skip
    """Outputs ``phi_q S / guard(phi_q z)`` of one block of queries, their normalizers and guard flags."""
    g = tl.program_id(0)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rv = tl.arange(0, BV)
    rm = tl.arange(0, BM)
    inside = rn < n
    proj, square, offset, sign, shift = load_side(
        proj_ptr, square_ptr, offset_ptr, sign_ptr, shift_ptr, g, d, m, BD, BM, HAS_SIGN, TRIG
    )
    x = load_rows(q_ptr, g, n, rn, inside, d, BD)
    log, mult, _ = log_features(x, inside, proj, square, offset, sign, shift, TRIG)
    phi = tl.exp(log - finite(tl.max(log, axis=1))[:, None]) * mult
    state_mask = (rm[:, None] < m) & (rv[None, :] < dv)
    sums = tl.load(sums_ptr + (g * m + rm[:, None]) * dv + rv[None, :], mask=state_mask, other=0.0)
    norm = tl.load(norm_ptr + g * m + rm, mask=rm < m, other=0.0)
    y = tl.dot(phi, sums, input_precision=DOT_PRECISION)
    den = tl.sum(phi * norm[None, :], axis=1)
    if TRIG:
        mag = tl.load(mag_ptr + g * m + rm, mask=rm < m, other=0.0)
        bound = tl.sum(tl.abs(phi) * mag[None, :], axis=1)
    else:
        bound = tl.sum(tl.abs(phi) * norm[None, :], axis=1)
    den, free = guard(den, bound, eps, TRIG or HAS_SIGN)
    store_rows(out_ptr, y / den[:, None], g, n, rn, inside, dv, BV)
    tl.store(den_ptr + g * n + rn, den, mask=inside)
    tl.store(free_ptr + g * n + rn, free, mask=inside)


@triton.jit
def query_grads_kernel(
    q_ptr, grad_out_ptr, out_ptr, den_ptr, free_ptr, proj_ptr, square_ptr, offset_ptr, sign_ptr, shift_ptr,
    sums_ptr, norm_ptr, grad_q_ptr, grad_sums_ptr, grad_norm_ptr,
    grad_proj_ptr, grad_square_ptr, grad_offset_ptr,
    n, d, m, dv, rows,
    BN: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BV: tl.constexpr,
    HAS_SIGN: tl.constexpr, TRIG: tl.constexpr,
):  # fmt: skip
    """``grad q`` of one split of queries; its shares of the gradients of the state and the query side."""
    g = tl.program_id(0)
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    rv = tl.arange(0, BV)
    rm = tl.arange(0, BM)
    state_mask = (rm[:, None] < m) & (rv[None, :] < dv)
    sums = tl.load(sums_ptr + (g * m + rm[:, None]) * dv + rv[None, :], mask=state_mask, other=0.0)
    norm = tl.load(norm_ptr + g * m + rm, mask=rm < m, other=0.0)
    grad_sums = tl.zeros((BM, BV), tl.float32)
    grad_norm = tl.zeros((BM,), tl.float32)
    grad_proj = tl.zeros((BD, BM), tl.float32)
    grad_square = tl.zeros((BD,), tl.float32)
    grad_offset = tl.zeros((BM,), tl.float32)
    lo = split * rows
    hi = tl.minimum(lo + rows, n)
    for start in range(lo, hi, BN):
        proj, square, offset, sign, shift = load_side(
            proj_ptr, square_ptr, offset_ptr, sign_ptr, shift_ptr, g, d, m, BD, BM, HAS_SIGN, TRIG
        )
        rn = start + tl.arange(0, BN)
        inside = rn < hi
        x = load_rows(q_ptr, g, n, rn, inside, d, BD)
        log, mult, u = log_features(x, inside, proj, square, offset, sign, shift, TRIG)
        magnitude = tl.exp(log - finite(tl.max(log, axis=1))[:, None])
        phi = magnitude * mult
        grad_num, grad_den = output_grads(grad_out_ptr, out_ptr, den_ptr, free_ptr, g, n, rn, inside, dv, BV)
        grad_phi = (
            tl.dot(grad_num, tl.trans(sums), input_precision=DOT_PRECISION)
            + grad_den[:, None] * norm[None, :]
        )
        grad_sums += tl.dot(tl.trans(phi), grad_num, input_precision=DOT_PRECISION)
        grad_norm += tl.sum(phi * grad_den[:, None], axis=0)
        grad_x, grad_u, grad_log, row = features_vjp(
            grad_phi, phi, magnitude, x, u, proj, square, sign, shift, TRIG
        )
        store_rows(grad_q_ptr, grad_x, g, n, rn, inside, d, BD)
        grad_proj, grad_square, grad_offset = add_side_grads(
            grad_proj, grad_square, grad_offset, x, grad_u, grad_log, row
        )
    base = g * splits + split
    store_side_grads(grad_proj, grad_square, grad_offset, grad_proj_ptr, grad_square_ptr, grad_offset_ptr,
                     base, d, m, BD, BM)  # fmt: skip
    tl.store(grad_sums_ptr + (base * m + rm[:, None]) * dv + rv[None, :], grad_sums, mask=state_mask)
    tl.store(grad_norm_ptr + base * m + rm, grad_norm, mask=rm < m)


@triton.jit
def key_grads_kernel(
    k_ptr, v_ptr, mask_ptr, proj_ptr, square_ptr, offset_ptr, sign_ptr, shift_ptr, top_ptr,
    grad_sums_ptr, grad_norm_ptr, grad_k_ptr, grad_v_ptr, grad_proj_ptr, grad_square_ptr, grad_offset_ptr,
    n, d, m, dv, rows,
    BN: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BV: tl.constexpr,
    HAS_MASK: tl.constexpr, TRIG: tl.constexpr,
):  # fmt: skip
    """``grad k``, ``grad v`` of one split of keys from the state's gradient; its share of the key side's."""
    g = tl.program_id(0)
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    rv = tl.arange(0, BV)
    rm = tl.arange(0, BM)
    state_mask = (rm[:, None] < m) & (rv[None, :] < dv)
    reference = finite(tl.load(top_ptr + g * m + rm, mask=rm < m, other=0.0))
    grad_proj = tl.zeros((BD, BM), tl.float32)
    grad_square = tl.zeros((BD,), tl.float32)
    grad_offset = tl.zeros((BM,), tl.float32)
    lo = split * rows
    hi = tl.minimum(lo + rows, n)
    for start in range(lo, hi, BN):
        # reloaded per block (from L2) as the side's tensors are: not held in shared memory across the loop
        grad_sums = tl.load(
            grad_sums_ptr + (g * m + rm[:, None]) * dv + rv[None, :], mask=state_mask, other=0.0
        )
        grad_norm = tl.load(grad_norm_ptr + g * m + rm, mask=rm < m, other=0.0)
        proj, square, offset, sign, shift = load_side(
            proj_ptr, square_ptr, offset_ptr, sign_ptr, shift_ptr, g, d, m, BD, BM, False, TRIG
        )
        rn = start + tl.arange(0, BN)
        inside = rn < hi
        x = load_rows(k_ptr, g, n, rn, inside, d, BD)
        val = load_rows(v_ptr, g, n, rn, inside, dv, BV)
        valid = valid_keys(mask_ptr, g, n, rn, inside, HAS_MASK)
        log, mult, u = log_features(x, valid, proj, square, offset, sign, shift, TRIG)
        magnitude = tl.exp(log - reference[None, :])
        phi = magnitude * mult
        grad_phi = tl.dot(val, tl.trans(grad_sums), input_precision=DOT_PRECISION) + grad_norm[None, :]
        store_rows(
            grad_v_ptr, tl.dot(phi, grad_sums, input_precision=DOT_PRECISION), g, n, rn, inside, dv, BV
        )
        grad_x, grad_u, grad_log, row = features_vjp(
            grad_phi, phi, magnitude, x, u, proj, square, sign, shift, TRIG
        )
        store_rows(grad_k_ptr, grad_x, g, n, rn, inside, d, BD)
        grad_proj, grad_square, grad_offset = add_side_grads(
            grad_proj, grad_square, grad_offset, x, grad_u, grad_log, row
        )
    store_side_grads(grad_proj, grad_square, grad_offset, grad_proj_ptr, grad_square_ptr, grad_offset_ptr,
                     g * splits + split, d, m, BD, BM)  # fmt: skip


def _side_grads(size: int, splits: int, d: int, m: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """The programs' shares of a side's gradients: ``(G, splits, d, m)``, ``(.., d)``, ``(.., m)``."""
    return (
        torch.empty(size, splits, d, m, device=device),
        torch.empty(size, splits, d, device=device),
        torch.empty(size, splits, m, device=device),
    )


def _summed_side_grads(
    shares: tuple[torch.Tensor, ...], like: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A side's gradients ``(G, d, m)``, ``(G, d, 1)``, ``(G, 1, m)`` in the dtypes of ``like``."""
    proj, square, offset = (s.sum(dim=1) for s in shares)
    return (
        proj.to(like[0].dtype),
        square.unsqueeze(-1).to(like[1].dtype),
        offset.unsqueeze(-2).to(like[2].dtype),
    )


class _NonCausalAttention(torch.autograd.Function):
    """Non-causal RF attention of ``(G, N, d)`` inputs with closed-form features (Eq. 7), Triton kernels.

    Saved: the inputs, the state ``(S, z)``, the outputs (float32) and the guarded normalizers.
    """

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        query_projection: torch.Tensor,
        query_square: torch.Tensor,
        query_offset: torch.Tensor,
        key_projection: torch.Tensor,
        key_square: torch.Tensor,
        key_offset: torch.Tensor,
        sign: torch.Tensor | None,
        wave_shift: torch.Tensor | None,
        eps: float,
    ) -> torch.Tensor:
        from rf_attention.ops.features import FeatureSide

        size, n_q, d = q.shape
        n_k, dv = k.shape[1], v.shape[-1]
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        mask_u8 = None if mask is None else mask.to(torch.uint8).contiguous()
        ks = KernelSide(FeatureSide(key_projection, key_square, key_offset, None, wave_shift), size)
        m, device = ks.m, q.device
        sizes = {"BN": BLOCK_ROWS, "BD": block(d), "BM": block(m), "BV": block(dv)}
        splits, rows = _splits(size, n_k)
        sums = torch.empty(size, splits, m, dv, device=device)
        norm, mag, top = (torch.empty(size, splits, m, device=device) for _ in range(3))
        key_sums_kernel[(size, splits)](
            k, v, k if mask_u8 is None else mask_u8, *ks.args(), sums, norm, mag, top, n_k, d, m, dv, rows,
            HAS_MASK=mask_u8 is not None, TRIG=ks.trigonometric, **sizes, **LAUNCH,
        )  # fmt: skip
        reference = top.amax(dim=1)  # (G, m)
        decay = torch.exp(top - finite_or_zero(reference).unsqueeze(1))
        sums = (sums * decay.unsqueeze(-1)).sum(dim=1).contiguous()
        norm, mag = ((t * decay).sum(dim=1).contiguous() for t in (norm, mag))
        folded = query_offset + finite_or_zero(reference).unsqueeze(1).to(query_offset.dtype)
        qs = KernelSide(FeatureSide(query_projection, query_square, folded, sign, wave_shift), size)
        out = torch.empty(size, n_q, dv, device=device)
        den, free = torch.empty(size, n_q, device=device), torch.empty(size, n_q, device=device)
        query_outputs_kernel[(size, triton.cdiv(n_q, BLOCK_ROWS))](
            q, *qs.args(), sums, norm, mag, out, den, free, n_q, d, m, dv, eps,
            HAS_SIGN=qs.has_sign, TRIG=qs.trigonometric, **sizes, **LAUNCH,
        )  # fmt: skip
        ctx.save_for_backward(
            q, k, v, mask_u8, query_projection, query_square, query_offset, key_projection, key_square,
            key_offset, sign, wave_shift, sums, norm, reference, out, den, free,
        )  # fmt: skip
        return out.to(v.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        from rf_attention.ops.features import FeatureSide

        (
            q, k, v, mask_u8, query_projection, query_square, query_offset, key_projection, key_square,
            key_offset, sign, wave_shift, sums, norm, reference, out, den, free,
        ) = ctx.saved_tensors  # fmt: skip
        size, n_q, d = q.shape
        n_k, dv = k.shape[1], v.shape[-1]
        device = q.device
        folded = query_offset + finite_or_zero(reference).unsqueeze(1).to(query_offset.dtype)
        qs = KernelSide(FeatureSide(query_projection, query_square, folded, sign, wave_shift), size)
        ks = KernelSide(FeatureSide(key_projection, key_square, key_offset, None, wave_shift), size)
        m = qs.m
        sizes = {"BN": BLOCK_ROWS, "BD": block(d), "BM": block(m), "BV": block(dv)}
        grad_out = grad_out.contiguous()
        splits, rows = _splits(size, n_q)
        grad_q = torch.empty(size, n_q, d, device=device)
        grad_sums = torch.empty(size, splits, m, dv, device=device)
        grad_norm = torch.empty(size, splits, m, device=device)
        query_shares = _side_grads(size, splits, d, m, device)
        query_grads_kernel[(size, splits)](
            q, grad_out, out, den, free, *qs.args(), sums, norm, grad_q, grad_sums, grad_norm, *query_shares,
            n_q, d, m, dv, rows, HAS_SIGN=qs.has_sign, TRIG=qs.trigonometric, **sizes, **LAUNCH,
        )  # fmt: skip
        grad_sums, grad_norm = grad_sums.sum(dim=1).contiguous(), grad_norm.sum(dim=1).contiguous()
        splits, rows = _splits(size, n_k)
        grad_k = torch.empty(size, n_k, d, device=device)
        grad_v = torch.empty(size, n_k, dv, device=device)
        key_shares = _side_grads(size, splits, d, m, device)
        key_grads_kernel[(size, splits)](
            k, v, k if mask_u8 is None else mask_u8, *ks.args(), reference.contiguous(), grad_sums, grad_norm,
            grad_k, grad_v, *key_shares, n_k, d, m, dv, rows,
            HAS_MASK=mask_u8 is not None, TRIG=ks.trigonometric, **sizes, **LAUNCH,
        )  # fmt: skip
        query_grads = _summed_side_grads(query_shares, (query_projection, query_square, query_offset))
        key_grads = _summed_side_grads(key_shares, (key_projection, key_square, key_offset))
        return (
            grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), None, *query_grads, *key_grads,
            None, None, None,
        )  # fmt: skip


def noncausal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    closed: ClosedForm,
    eps: float,
) -> torch.Tensor:
    """``phi_q (phi_k^T v) / (phi_q phi_k^T 1)`` (Eq. 7) of ``q (G, N_q, d)``, ``k, v (G, N_k, .)``.

    ``mask`` bool ``(G, N_k)`` (True at padding) or None; ``closed`` the features of inputs flattened to
    ``G`` sequences; ``eps`` the normalizer's relative guard. Returns ``(G, N_q, Dv)`` in ``v``'s dtype.
    """
    qs, ks = closed.query, closed.key
    return _NonCausalAttention.apply(
        q, k, v, mask, qs.projection, qs.square, qs.offset, ks.projection, ks.square, ks.offset, qs.sign,
        qs.wave_shift, eps,
    )  # fmt: skip
