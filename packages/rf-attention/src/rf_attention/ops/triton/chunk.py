# mypy: disable-error-code="import-untyped,untyped-decorator,no-untyped-def"
# (Triton ships no type information, and its kernels take untyped pointers and constexprs.)
r"""The chunked causal Triton kernel: intra-chunk masked products, the state passed from chunk to chunk.

One program per sequence walks its chunks of ``C`` positions in order. Key ``j``'s features are divided
by ``exp(c_j)``, ``c_j`` its largest log-feature; query ``i`` uses the running reference
$R_i = \max(R, \max_{j \le i} c_j)$ (past keys only), ``R`` the reference entering the chunk, so every
weight $e^{c_j - R_i}$ and the carry $e^{R - R_i}$ is at most 1 (the PyTorch path's stabilizer,
``rf_attention.ops.causal``). Query ``i`` of a chunk reads
$e^{R - R_i} \phi_{q_i} [S, z] + \sum_{j \le i} e^{c_j - R_i} (\phi_{q_i} \cdot \phi_{k_j}) [v_j, 1]$,
then the state moves to the chunk's last reference $E$:
$[S, z] \leftarrow e^{R - E} [S, z] + \sum_j e^{c_j - E} \phi_{k_j}^\top [v_j, 1]$. The references
entering every chunk are saved for the backward pass: ``query_grads`` walks the chunks forward again
(the state rebuilt), ``key_grads`` walks them backward with the state's gradient
$dP_t = e^{R_t - E_t} dP_{t+1} + \sum_i e^{R_t - R_i} \phi_{q_i}^\top d[y_i]$.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from rf_attention.ops.features import ClosedForm, FeatureSide
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
from rf_attention.ops.triton.noncausal import _side_grads, _summed_side_grads

#: Positions per chunk when the call names none.
DEFAULT_CHUNK = 64
#: Warps per program of the chunk kernels.
NUM_WARPS = 8
#: Launch options: the warps, fused multiply-adds (named: Triton warns while its default is unset), and one
#: stage: the chunks are walked in order through the state, and pipelined loads hold more copies of every
#: operand in shared memory (one stage: the forward kernel takes 64 KiB on sm_80, 96 KiB on sm_90).
LAUNCH = {"num_warps": NUM_WARPS, "enable_fp_fusion": True, "num_stages": 1}


@triton.jit
def _chunk_features(
    q_ptr, k_ptr, v_ptr, mask_ptr, g, start, n, d, dv, reference,
    q_proj, q_square, q_offset, q_sign, q_shift, k_proj, k_square, k_offset, k_sign, k_shift,
    BC: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, HAS_MASK: tl.constexpr, TRIG: tl.constexpr,
):  # fmt: skip
    """One chunk's inputs, features, key log-scales and reference weights (see the module docstring)."""
    rc = tl.arange(0, BC)
    rn = start + rc
    inside = rn < n
    xq = load_rows(q_ptr, g, n, rn, inside, d, BD)
    xk = load_rows(k_ptr, g, n, rn, inside, d, BD)
    val = load_rows(v_ptr, g, n, rn, inside, dv, BV)
    valid = valid_keys(mask_ptr, g, n, rn, inside, HAS_MASK)
    log_q, mult_q, u_q = log_features(xq, inside, q_proj, q_square, q_offset, q_sign, q_shift, TRIG)
    mag_q = tl.exp(log_q - finite(tl.max(log_q, axis=1))[:, None])
    log_k, mult_k, u_k = log_features(xk, valid, k_proj, k_square, k_offset, k_sign, k_shift, TRIG)
    key_scale = tl.max(log_k, axis=1)  # -inf at padding
    mag_k = tl.exp(log_k - finite(key_scale)[:, None])
    causal = rc[:, None] >= rc[None, :]
    running = tl.maximum(reference, tl.max(tl.where(causal, key_scale[None, :], float("-inf")), axis=1))
    safe_running = finite(running)
    carry = tl.exp(reference - safe_running)
    weights = tl.where(causal, tl.exp(key_scale[None, :] - safe_running[:, None]), 0.0)
    return xq, xk, val, u_q, u_k, mag_q, mag_q * mult_q, mag_k, mag_k * mult_k, key_scale, carry, weights


@triton.jit
def chunk_forward_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr,
    qp_ptr, qsq_ptr, qo_ptr, qsg_ptr, qsh_ptr, kp_ptr, ksq_ptr, ko_ptr, ksg_ptr, ksh_ptr,
    out_ptr, den_ptr, free_ptr, refs_ptr, sums_ptr, norm_ptr, mag_ptr,
    n, d, m, dv, eps,
    BC: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BV: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_SIGN: tl.constexpr, TRIG: tl.constexpr,
):  # fmt: skip
    """One sequence's outputs, normalizers, guard flags, references entering each chunk, final state."""
    g = tl.program_id(0)
    rc = tl.arange(0, BC)
    rv = tl.arange(0, BV)
    rm = tl.arange(0, BM)
    sums = tl.zeros((BM, BV), tl.float32)
    norm = tl.zeros((BM,), tl.float32)
    mag = tl.zeros((BM,), tl.float32)
    reference = tl.max(tl.full((BC,), float("-inf"), tl.float32), axis=0)
    chunks = tl.cdiv(n, BC)
    for t in range(0, chunks):
        q_proj, q_square, q_offset, q_sign, q_shift = load_side(
            qp_ptr, qsq_ptr, qo_ptr, qsg_ptr, qsh_ptr, g, d, m, BD, BM, HAS_SIGN, TRIG
        )
        k_proj, k_square, k_offset, k_sign, k_shift = load_side(
            kp_ptr, ksq_ptr, ko_ptr, ksg_ptr, ksh_ptr, g, d, m, BD, BM, False, TRIG
        )
        start = t * BC
        tl.store(refs_ptr + g * (chunks + 1) + t, reference)
        _, _, val, _, _, _, phi_q, _, phi_k, key_scale, carry, weights = _chunk_features(
            q_ptr, k_ptr, v_ptr, mask_ptr, g, start, n, d, dv, reference,
            q_proj, q_square, q_offset, q_sign, q_shift, k_proj, k_square, k_offset, k_sign, k_shift,
            BC, BD, BV, HAS_MASK, TRIG,
        )  # fmt: skip
        scores = tl.dot(phi_q, tl.trans(phi_k), input_precision=DOT_PRECISION) * weights
        y = carry[:, None] * tl.dot(phi_q, sums, input_precision=DOT_PRECISION) + tl.dot(
            scores, val, input_precision=DOT_PRECISION
        )
        den = carry * tl.sum(phi_q * norm[None, :], axis=1) + tl.sum(scores, axis=1)
        bound = den
        if TRIG or HAS_SIGN:
            abs_q = tl.abs(phi_q)
            inner = tl.dot(abs_q, tl.trans(tl.abs(phi_k)), input_precision=DOT_PRECISION) * weights
            bound = carry * tl.sum(abs_q * mag[None, :], axis=1) + tl.sum(inner, axis=1)
        den, free = guard(den, bound, eps, TRIG or HAS_SIGN)
        rn = start + rc
        inside = rn < n
        store_rows(out_ptr, y / den[:, None], g, n, rn, inside, dv, BV)
        tl.store(den_ptr + g * n + rn, den, mask=inside)
        tl.store(free_ptr + g * n + rn, free, mask=inside)
        end = tl.maximum(reference, tl.max(key_scale, axis=0))
        safe_end = finite(end)
        decay = tl.exp(reference - safe_end)
        weighted = phi_k * tl.exp(key_scale - safe_end)[:, None]
        sums = sums * decay + tl.dot(tl.trans(weighted), val, input_precision=DOT_PRECISION)
        norm = norm * decay + tl.sum(weighted, axis=0)
        mag = mag * decay + tl.sum(tl.abs(weighted), axis=0)
        reference = end
    tl.store(refs_ptr + g * (chunks + 1) + chunks, reference)
    tl.store(
        sums_ptr + (g * m + rm[:, None]) * dv + rv[None, :], sums, mask=(rm[:, None] < m) & (rv[None, :] < dv)
    )
    tl.store(norm_ptr + g * m + rm, norm, mask=rm < m)
    tl.store(mag_ptr + g * m + rm, mag, mask=rm < m)


@triton.jit
def chunk_query_grads_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr,
    qp_ptr, qsq_ptr, qo_ptr, qsg_ptr, qsh_ptr, kp_ptr, ksq_ptr, ko_ptr, ksg_ptr, ksh_ptr,
    grad_out_ptr, out_ptr, den_ptr, free_ptr, refs_ptr,
    grad_q_ptr, grad_proj_ptr, grad_square_ptr, grad_offset_ptr,
    n, d, m, dv,
    BC: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BV: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_SIGN: tl.constexpr, TRIG: tl.constexpr,
):  # fmt: skip
    """``grad q`` and the query side's gradients of one sequence, the chunks walked forward."""
    g = tl.program_id(0)
    rc = tl.arange(0, BC)
    sums = tl.zeros((BM, BV), tl.float32)
    norm = tl.zeros((BM,), tl.float32)
    grad_proj = tl.zeros((BD, BM), tl.float32)
    grad_square = tl.zeros((BD,), tl.float32)
    grad_offset = tl.zeros((BM,), tl.float32)
    chunks = tl.cdiv(n, BC)
    for t in range(0, chunks):
        q_proj, q_square, q_offset, q_sign, q_shift = load_side(
            qp_ptr, qsq_ptr, qo_ptr, qsg_ptr, qsh_ptr, g, d, m, BD, BM, HAS_SIGN, TRIG
        )
        k_proj, k_square, k_offset, k_sign, k_shift = load_side(
            kp_ptr, ksq_ptr, ko_ptr, ksg_ptr, ksh_ptr, g, d, m, BD, BM, False, TRIG
        )
        start = t * BC
        reference = tl.load(refs_ptr + g * (chunks + 1) + t)
        xq, _, val, u_q, _, mag_q, phi_q, _, phi_k, key_scale, carry, weights = _chunk_features(
            q_ptr, k_ptr, v_ptr, mask_ptr, g, start, n, d, dv, reference,
            q_proj, q_square, q_offset, q_sign, q_shift, k_proj, k_square, k_offset, k_sign, k_shift,
            BC, BD, BV, HAS_MASK, TRIG,
        )  # fmt: skip
        rn = start + rc
        inside = rn < n
        grad_num, grad_den = output_grads(grad_out_ptr, out_ptr, den_ptr, free_ptr, g, n, rn, inside, dv, BV)
        grad_scores = (
            tl.dot(grad_num, tl.trans(val), input_precision=DOT_PRECISION) + grad_den[:, None]
        ) * weights
        grad_phi = carry[:, None] * (
            tl.dot(grad_num, tl.trans(sums), input_precision=DOT_PRECISION)
            + grad_den[:, None] * norm[None, :]
        ) + tl.dot(grad_scores, phi_k, input_precision=DOT_PRECISION)
        grad_x, grad_u, grad_log, row = features_vjp(
            grad_phi, phi_q, mag_q, xq, u_q, q_proj, q_square, q_sign, q_shift, TRIG
        )
        store_rows(grad_q_ptr, grad_x, g, n, rn, inside, d, BD)
        grad_proj, grad_square, grad_offset = add_side_grads(
            grad_proj, grad_square, grad_offset, xq, grad_u, grad_log, row
        )
        safe_end = finite(tl.load(refs_ptr + g * (chunks + 1) + t + 1))
        decay = tl.exp(reference - safe_end)
        weighted = phi_k * tl.exp(key_scale - safe_end)[:, None]
        sums = sums * decay + tl.dot(tl.trans(weighted), val, input_precision=DOT_PRECISION)
        norm = norm * decay + tl.sum(weighted, axis=0)
    store_side_grads(grad_proj, grad_square, grad_offset, grad_proj_ptr, grad_square_ptr, grad_offset_ptr,
                     g, d, m, BD, BM)  # fmt: skip


@triton.jit
def chunk_key_grads_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr,
    qp_ptr, qsq_ptr, qo_ptr, qsg_ptr, qsh_ptr, kp_ptr, ksq_ptr, ko_ptr, ksg_ptr, ksh_ptr,
    grad_out_ptr, out_ptr, den_ptr, free_ptr, refs_ptr,
    grad_k_ptr, grad_v_ptr, grad_proj_ptr, grad_square_ptr, grad_offset_ptr,
    n, d, m, dv,
    BC: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BV: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_SIGN: tl.constexpr, TRIG: tl.constexpr,
):  # fmt: skip
    """``grad k``, ``grad v`` and the key side's gradients of one sequence, the chunks walked backward."""
    g = tl.program_id(0)
    rc = tl.arange(0, BC)
    grad_sums = tl.zeros((BM, BV), tl.float32)
    grad_norm = tl.zeros((BM,), tl.float32)
    grad_proj = tl.zeros((BD, BM), tl.float32)
    grad_square = tl.zeros((BD,), tl.float32)
    grad_offset = tl.zeros((BM,), tl.float32)
    chunks = tl.cdiv(n, BC)
    for back in range(0, chunks):
        q_proj, q_square, q_offset, q_sign, q_shift = load_side(
            qp_ptr, qsq_ptr, qo_ptr, qsg_ptr, qsh_ptr, g, d, m, BD, BM, HAS_SIGN, TRIG
        )
        k_proj, k_square, k_offset, k_sign, k_shift = load_side(
            kp_ptr, ksq_ptr, ko_ptr, ksg_ptr, ksh_ptr, g, d, m, BD, BM, False, TRIG
        )
        t = chunks - 1 - back
        start = t * BC
        reference = tl.load(refs_ptr + g * (chunks + 1) + t)
        _, xk, val, _, u_k, _, phi_q, mag_k, phi_k, key_scale, carry, weights = _chunk_features(
            q_ptr, k_ptr, v_ptr, mask_ptr, g, start, n, d, dv, reference,
            q_proj, q_square, q_offset, q_sign, q_shift, k_proj, k_square, k_offset, k_sign, k_shift,
            BC, BD, BV, HAS_MASK, TRIG,
        )  # fmt: skip
        rn = start + rc
        inside = rn < n
        grad_num, grad_den = output_grads(grad_out_ptr, out_ptr, den_ptr, free_ptr, g, n, rn, inside, dv, BV)
        safe_end = finite(tl.load(refs_ptr + g * (chunks + 1) + t + 1))
        key_weights = tl.exp(key_scale - safe_end)
        grad_scores = (
            tl.dot(grad_num, tl.trans(val), input_precision=DOT_PRECISION) + grad_den[:, None]
        ) * weights
        scores = tl.dot(phi_q, tl.trans(phi_k), input_precision=DOT_PRECISION) * weights
        grad_phi = key_weights[:, None] * (
            tl.dot(val, tl.trans(grad_sums), input_precision=DOT_PRECISION) + grad_norm[None, :]
        ) + tl.dot(tl.trans(grad_scores), phi_q, input_precision=DOT_PRECISION)
        grad_val = key_weights[:, None] * tl.dot(phi_k, grad_sums, input_precision=DOT_PRECISION) + tl.dot(
            tl.trans(scores), grad_num, input_precision=DOT_PRECISION
        )
        grad_x, grad_u, grad_log, row = features_vjp(
            grad_phi, phi_k, mag_k, xk, u_k, k_proj, k_square, k_sign, k_shift, TRIG
        )
        store_rows(grad_k_ptr, grad_x, g, n, rn, inside, d, BD)
        store_rows(grad_v_ptr, grad_val, g, n, rn, inside, dv, BV)
        grad_proj, grad_square, grad_offset = add_side_grads(
            grad_proj, grad_square, grad_offset, xk, grad_u, grad_log, row
        )
        decay = tl.exp(reference - safe_end)
        carried = phi_q * carry[:, None]
        grad_sums = grad_sums * decay + tl.dot(tl.trans(carried), grad_num, input_precision=DOT_PRECISION)
        grad_norm = grad_norm * decay + tl.sum(carried * grad_den[:, None], axis=0)
    store_side_grads(grad_proj, grad_square, grad_offset, grad_proj_ptr, grad_square_ptr, grad_offset_ptr,
                     g, d, m, BD, BM)  # fmt: skip


def _chunk_block(chunk_size: int | None) -> int:
    """The kernel's chunk: ``chunk_size`` if it is a power of two from 16 to 128, the default if None."""
    if chunk_size is None:
        return DEFAULT_CHUNK
    if chunk_size not in (16, 32, 64, 128):
        raise ValueError(
            f"chunk_size: the Triton causal kernel takes 16, 32, 64 or 128 positions per chunk, got "
            f"{chunk_size}"
        )
    return chunk_size


class _ChunkAttention(torch.autograd.Function):
    """Causal RF attention of ``(G, N, d)`` inputs with closed-form features, chunk by chunk (Triton).

    Saved: the inputs, the outputs (float32), the guarded normalizers and the reference entering each
    chunk; the backward pass recomputes the features and the states.
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
        chunk: int,
    ) -> torch.Tensor:
        size, n, d = q.shape
        dv = v.shape[-1]
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        mask_u8 = None if mask is None else mask.to(torch.uint8).contiguous()
        qs = KernelSide(FeatureSide(query_projection, query_square, query_offset, sign, wave_shift), size)
        ks = KernelSide(FeatureSide(key_projection, key_square, key_offset, None, wave_shift), size)
        m, device = qs.m, q.device
        out = torch.empty(size, n, dv, device=device)
        den, free = torch.empty(size, n, device=device), torch.empty(size, n, device=device)
        refs = torch.empty(size, triton.cdiv(n, chunk) + 1, device=device)
        sums = torch.empty(size, m, dv, device=device)
        norm, mag = torch.empty(size, m, device=device), torch.empty(size, m, device=device)
        chunk_forward_kernel[(size,)](
            q, k, v, k if mask_u8 is None else mask_u8, *qs.args(), *ks.args(),
            out, den, free, refs, sums, norm, mag, n, d, m, dv, eps, **_flags(chunk, d, m, dv, mask_u8, qs),
            **LAUNCH,
        )  # fmt: skip
        ctx.save_for_backward(
            q, k, v, mask_u8, query_projection, query_square, query_offset, key_projection, key_square,
            key_offset, sign, wave_shift, out, den, free, refs,
        )  # fmt: skip
        ctx.chunk = chunk
        return out.to(v.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (
            q, k, v, mask_u8, query_projection, query_square, query_offset, key_projection, key_square,
            key_offset, sign, wave_shift, out, den, free, refs,
        ) = ctx.saved_tensors  # fmt: skip
        size, n, d = q.shape
        dv = v.shape[-1]
        qs = KernelSide(FeatureSide(query_projection, query_square, query_offset, sign, wave_shift), size)
        ks = KernelSide(FeatureSide(key_projection, key_square, key_offset, None, wave_shift), size)
        m, device = qs.m, q.device
        flags = _flags(ctx.chunk, d, m, dv, mask_u8, qs)
        inputs = (q, k, v, k if mask_u8 is None else mask_u8, *qs.args(), *ks.args())
        saved = (grad_out.contiguous(), out, den, free, refs)
        grad_q = torch.empty(size, n, d, device=device)
        query_shares = _side_grads(size, 1, d, m, device)
        chunk_query_grads_kernel[(size,)](
            *inputs,
            *saved,
            grad_q,
            *query_shares,
            n,
            d,
            m,
            dv,
            **flags,
            num_warps=NUM_WARPS,
            enable_fp_fusion=True,
        )
        grad_k, grad_v = torch.empty(size, n, d, device=device), torch.empty(size, n, dv, device=device)
        key_shares = _side_grads(size, 1, d, m, device)
        chunk_key_grads_kernel[(size,)](
            *inputs,
            *saved,
            grad_k,
            grad_v,
            *key_shares,
            n,
            d,
            m,
            dv,
            **flags,
            num_warps=NUM_WARPS,
            enable_fp_fusion=True,
        )
        query_grads = _summed_side_grads(query_shares, (query_projection, query_square, query_offset))
        key_grads = _summed_side_grads(key_shares, (key_projection, key_square, key_offset))
        return (
            grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), None, *query_grads, *key_grads,
            None, None, None, None,
        )  # fmt: skip


def _flags(
    chunk: int, d: int, m: int, dv: int, mask: torch.Tensor | None, side: KernelSide
) -> dict[str, Any]:
    """The constexpr arguments of the chunk kernels."""
    return {
        "BC": chunk, "BD": block(d), "BM": block(m), "BV": block(dv),
        "HAS_MASK": mask is not None, "HAS_SIGN": side.has_sign, "TRIG": side.trigonometric,
    }  # fmt: skip


def chunk_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    closed: ClosedForm,
    eps: float,
    chunk_size: int | None,
) -> torch.Tensor:
    """Causal ``sum_{j<=i} phi_q_i . phi_k_j v_j / sum_{j<=i} phi_q_i . phi_k_j`` of ``(G, N, .)`` inputs.

    ``mask`` bool ``(G, N)`` (True at padding) or None; ``closed`` the features of the ``G`` sequences;
    ``chunk_size`` positions per chunk (16, 32, 64 or 128; None: ``DEFAULT_CHUNK``). ``(G, N, Dv)``.
    """
    qs, ks = closed.query, closed.key
    return _ChunkAttention.apply(
        q, k, v, mask, qs.projection, qs.square, qs.offset, ks.projection, ks.square, ks.offset, qs.sign,
        qs.wave_shift, eps, _chunk_block(chunk_size),
    )  # fmt: skip
