"""Attention as functions on ``(B, H, N, Dh)`` tensors: kernelized (linear-time) and exact softmax."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import overload

import torch
import torch.nn.functional as F

from rf_attention import varlen
from rf_attention.ops.causal import causal_attention
from rf_attention.ops.common import DEFAULT_CHUNK_SIZE, FeatureFn
from rf_attention.ops.features import ClosedForm, Features, feature_strategy, qk_scale
from rf_attention.ops.noncausal import noncausal_attention
from rf_attention.ops.triton import check_backend, uses_triton
from rf_attention.ops.window import window_attention
from rf_features import FeatureMap, LearnedFeatureMap
from spectraformer_core import check_int

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def linear_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    key_log_scale: torch.Tensor | None = None,
    eps: float | None = None,
    chunk_size: int | None = None,
    cu_seqlens: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    r"""Kernelized attention $D^{-1} (\phi_q \phi_k^\top) v$ in $O(N)$ time and memory (Eq. 7, Figure 1).

    Non-causal: $\phi_q (\phi_k^\top v) / (\phi_q (\phi_k^\top \mathbf 1))$. Causal: the sums run over
    keys $j \le i$, computed by chunked prefix sums: within a chunk of ``chunk_size`` positions an explicit
    masked ``chunk x chunk`` product, across chunks a running ``m x (Dv + 1)`` state (no ``N x N`` matrix, no
    state per position). Runs through the same chunked autograd functions as
    [`rf_attention`][rf_attention.rf_attention], with the given features as the "feature map"; the inputs and
    the ``[phi_k, key_log_scale]`` pair are what autograd keeps.

    Args:
        phi_q: ``(..., N_q, m)`` query features.
        phi_k: ``(..., N_k, m)`` key features.
        v: ``(..., N_k, Dv)`` values.
        causal: query $i$ attends to keys $j \le i$ (needs ``N_q == N_k``).
        key_padding_mask: bool ``(B, N_k)``, True at padding; padded keys contribute nothing, and a row whose
            keys are all padding gives zeros.
        key_log_scale: ``(..., N_k)``: the true key features are ``phi_k * exp(key_log_scale)`` (as returned
            by ``FeatureMap.forward_with_key_scales``). Each query $i$ divides them by one constant, the
            largest scale over the keys it sees (causal: over $j \le i$ only), so nothing overflows and no
            position depends on a later one.
        eps: relative guard of the normalizer $D$ for features with signs (TrigRF's, negative quadrature
            weights): $|D| \le \varepsilon\, |\phi_q| \cdot \sum_j |\phi_{k_j}|$ becomes
            $\operatorname{sign}(D)$ times that bound. Positive features are guarded only where $D = 0$ (rows
            whose keys are all padding give 0). Never an absolute floor: stabilized features can make a
            correct $D$ arbitrarily small. Default: the accumulation dtype's machine epsilon.
        chunk_size: the causal chunk: consecutive positions whose keys a query of the chunk reads by an
            explicit ``chunk x chunk`` product (default 128). No effect without ``causal`` (the
            non-causal kernel sizes its row groups by its own memory rule).
        cu_seqlens: ``(S + 1,)`` int32 cumulative starts of ``S`` sequences packed along ``N``
            (flash-attn's convention; inputs ``(1, H, T, *)``): each sequence attends to itself only
            ([`rf_attention.varlen`][rf_attention.varlen]).
        backend: ``"auto"`` or ``"torch"`` (given features always run on PyTorch); ``"triton"`` is
            refused: the Triton kernels compute the features inside the kernel from a feature map's closed
            form ([`rf_attention`][rf_attention.rf_attention]).

    Returns:
        ``(..., N_q, Dv)`` in ``v``'s dtype; float16/bfloat16 inputs are accumulated in float32.
    """
    check_backend(backend)
    if backend == "triton":
        raise ValueError(
            "backend: 'triton' is not available for linear_attention: the Triton kernels compute the "
            "features inside the kernel from a feature map's closed form (rf_attention(..., "
            "backend='triton')); given features run on backend='torch'"
        )
    if cu_seqlens is not None:
        return varlen.attend_packed(
            linear_attention,
            phi_q,
            phi_k,
            v,
            cu_seqlens,
            key_log_scale=key_log_scale,
            causal=causal,
            key_padding_mask=key_padding_mask,
            eps=eps,
            chunk_size=chunk_size,
        )
    _check_shapes(phi_q, phi_k, v, causal)
    acc = _accumulation_dtype(phi_q, phi_k, v)
    mask = _broadcast_key_mask(key_padding_mask, phi_k)
    log_scale = phi_k.new_zeros(phi_k.shape[:-1]) if key_log_scale is None else key_log_scale
    packed_k = torch.cat((phi_k.to(acc), log_scale.to(acc).unsqueeze(-1)), dim=-1)
    kernel = _chunk_parallel(mask, _given_features, causal=causal, width=phi_q.shape[-1])
    return _run_in_accumulation_dtype(phi_q, packed_k, v, kernel, eps=eps, chunk_size=chunk_size)


def _given_features(x: torch.Tensor, is_query: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Precomputed features as ``(log, multiplier)``: queries ``phi_q``; keys ``[phi_k, log_scale]``."""
    if is_query:
        return x.new_zeros(*x.shape[:-1], 1), x
    return x[..., -1:], x[..., :-1]


def _accumulation_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The widest dtype of ``tensors``, float32 in place of float16/bfloat16."""
    acc = tensors[0].dtype
    for t in tensors[1:]:
        acc = torch.promote_types(acc, t.dtype)
    return torch.float32 if acc in _LOW_PRECISION else acc


#: ``kernel(q, k, v, eps, chunk_size)`` of `_run_in_accumulation_dtype`, on tensors in the accumulation dtype.
Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, int | None], torch.Tensor]


def _run_in_accumulation_dtype(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kernel: Kernel,
    *,
    eps: float | None,
    chunk_size: int | None,
) -> torch.Tensor:
    """``kernel`` on ``q, k, v`` cast to the accumulation dtype, autocast off; the output in ``v``'s dtype.

    ``eps`` None becomes the accumulation dtype's machine epsilon; ``chunk_size`` is checked here once.
    """
    out_dtype = v.dtype
    acc = _accumulation_dtype(q, k, v)
    eps = torch.finfo(acc).eps if eps is None else eps
    if chunk_size is not None:
        check_int("chunk_size", chunk_size, minimum=1)
    q, k, v = q.to(acc), k.to(acc), v.to(acc)
    with torch.autocast(q.device.type, enabled=False):
        out = kernel(q, k, v, eps, chunk_size)
    return out.to(out_dtype)


def _chunk_parallel(key_mask: torch.Tensor | None, features: Features, *, causal: bool, width: int) -> Kernel:
    """The causal or non-causal chunked kernel with a feature strategy (``width`` wide) as a `Kernel`."""

    def kernel(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float, chunk_size: int | None
    ) -> torch.Tensor:
        if causal:
            chunk = DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size
            return causal_attention(q, k, v, key_mask, features, width=width, chunk=chunk, eps=eps)[0]
        return noncausal_attention(q, k, v, key_mask, features, width=width, eps=eps)

    return kernel


def _sliding_window(
    key_mask: torch.Tensor | None,
    features: FeatureFn,
    window: int,
    scale: float,
    log_factor: torch.Tensor | None,
) -> Kernel:
    """[`window_attention`][rf_attention.ops.window.window_attention] as a `Kernel` (``scale``: of q, k)."""

    def kernel(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float, chunk_size: int | None
    ) -> torch.Tensor:
        chunk = DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size
        return window_attention(
            q,
            k,
            v,
            key_mask,
            features,
            window=window,
            scale=scale * scale,
            chunk=chunk,
            eps=eps,
            log_factor=log_factor,
        )

    return kernel


def input_scale(head_dim: int, scale: float | None) -> float:
    r"""The factor of ``q`` and of ``k`` before the features for the logit scale ``scale`` of ``q . k``.

    $\sqrt{\text{scale}}$ on each side, so that $\phi(q \sqrt{s}) \cdot \phi(k \sqrt{s}) \approx
    \exp(s\, q \cdot k)$; by default ($s = D_h^{-1/2}$, ``scaled_dot_product_attention``'s)
    $D_h^{-1/4}$ ([`qk_scale`][rf_attention.ops.features.qk_scale]). Every random-feature path takes ``scale``
    this way: [`rf_attention`][rf_attention.rf_attention], the decoding of
    [`rf_attention.decoding`][rf_attention.decoding] and the Hugging Face attention (HF's ``scaling``).

    Raises:
        ValueError: ``scale`` is not positive.
    """
    if scale is None:
        return qk_scale(head_dim)
    if not scale > 0:
        raise ValueError(f"scale: expected a positive logit scale, got {scale!r}")
    return math.sqrt(scale)


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    cu_seqlens: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    r"""Exact attention $\operatorname{softmax}(q k^\top / \sqrt{D_h})\, v$ (Eq. 6).

    Computed by ``scaled_dot_product_attention``. The reference every approximation is tested against. Rows
    whose keys are all padding give zeros.

    Args:
        q: ``(B, H, N_q, Dh)``.
        k: ``(B, H, N_k, Dh)``.
        v: ``(B, H, N_k, Dv)``.
        causal: query $i$ attends to keys $j \le i$.
        key_padding_mask: bool ``(B, N_k)``, True at padding.
        dropout_p: dropout on the attention probabilities (use only in training).
        cu_seqlens: packed sequences, as in [`linear_attention`][rf_attention.linear_attention].
        scale: the logit scale of ``q . k`` (default ``Dh ** -0.5``), as ``scaled_dot_product_attention``'s.

    Returns:
        ``(B, H, N_q, Dv)``.
    """
    if cu_seqlens is not None:
        return varlen.attend_packed(
            softmax_attention,
            q,
            k,
            v,
            cu_seqlens,
            causal=causal,
            key_padding_mask=key_padding_mask,
            dropout_p=dropout_p,
            scale=scale,
        )
    _check_shapes(q, k, v, causal)
    if key_padding_mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=dropout_p, scale=scale)
    mask = _broadcast_key_mask(key_padding_mask, k)
    allowed = (~mask).unsqueeze(-2).expand(*q.shape[:-1], k.shape[-2])  # (B, H, N_q, N_k)
    if causal:
        allowed = allowed & torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    empty = ~allowed.any(dim=-1, keepdim=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | empty, dropout_p=dropout_p, scale=scale)
    return out.masked_fill(empty, 0.0)


def rf_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    feature_map: FeatureMap,
    *,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    query_padding_mask: torch.Tensor | None = None,
    eps: float | None = None,
    chunk_size: int | None = None,
    cu_seqlens: torch.Tensor | None = None,
    window: int = 0,
    backend: str = "auto",
    scale: float | None = None,
) -> torch.Tensor:
    r"""Random-feature attention approximating ``softmax_attention(q, k, v)`` in $O(N)$.

    ``q`` and ``k`` are scaled by $\sqrt{\text{scale}}$ each, $D_h^{-1/4}$ by default (so
    $\phi(q) \cdot \phi(k) \approx \exp(q \cdot k / \sqrt{D_h})$) and mapped by ``feature_map`` (its
    statistics computed once, from the whole sequence or the running averages) chunk by chunk inside a
    memory-lean autograd function: features are never kept for the backward pass, which recomputes them
    (``rf_attention.ops``). Stabilization (constants that cancel exactly, detached): non-causal,
    per-feature key maxima moved to the query side and each query row divided by its largest entry, so
    positive features never lose the normalizer's scale; causal, per-key scales combined over past keys only.
    The result is the plain formula's $\phi_q (\phi_k^\top v) / (\phi_q \phi_k^\top \mathbf 1)$
    ([`naive_rf_attention`][rf_attention.ops.naive.naive_rf_attention]).

    Args:
        q: ``(B, H, N_q, Dh)``, floating point (integer input is refused, not cast).
        k: ``(B, H, N_k, Dh)``.
        v: ``(B, H, N_k, Dv)``.
        feature_map: an ``rf_features.FeatureMap`` of dimension ``Dh``. In causal mode a map with
            data-dependent statistics (OPRF, SADERF) must use ``statistics_mode="running"``.
        causal: query $i$ attends to keys $j \le i$.
        key_padding_mask: bool ``(B, N_k)``, True at padding.
        query_padding_mask: bool ``(B, N_q)``, True at padding (left out of the feature map's statistics;
            self-attention passes the same mask as ``key_padding_mask``).
        eps: see [`linear_attention`][rf_attention.linear_attention].
        chunk_size: see [`linear_attention`][rf_attention.linear_attention].
        cu_seqlens: packed sequences, as in [`linear_attention`][rf_attention.linear_attention]; the
            feature map's batch statistics are then per sequence.
        window: the sliding-window hybrid (needs ``causal=True`` and ``kernel="softmax"``): query $i$
            weighs keys $j \in (i - w, i]$ by the exact $\exp(q_i \cdot k_j / \sqrt{D_h})$ and earlier
            keys by $\phi(q_i) \cdot \phi(k_j)$, in one normalized sum with one stabilizing reference
            ([`rf_attention.ops.window`][rf_attention.ops.window]), ``O(N (w + m))``. 0: plain random
            features; ``w >= N``: exact causal softmax. A learned map (``hedgehog``, ``t2r``) mixes the
            window with its features by LoLCATs' learned per-head factor, the map's ``window_logit``
            (created with ``window_factor=True``).
        backend: ``"auto"`` (the Triton kernels for CUDA tensors when triton imports and the map has a
            closed form, else PyTorch), ``"torch"`` or ``"triton"`` (refused on CPU tensors unless
            ``TRITON_INTERPRET=1``, for float64 and for maps without a closed form; the Attention guide's
            Backends section).
        scale: the logit scale of ``q . k`` (default ``Dh ** -0.5``, as ``scaled_dot_product_attention``'s),
            of the features' estimate and of the window's exact weights: ``sqrt(scale)`` multiplies each of
            ``q`` and ``k`` before the features.

    Returns:
        ``(B, H, N_q, Dv)``.
    """
    check_int("window", window, minimum=0)
    if window and not causal:
        raise ValueError(
            f"window: the sliding-window hybrid is causal (keys (i - window, i]); got window={window} with "
            "causal=False; pass causal=True or window=0"
        )
    if window and feature_map.kernel != "softmax":
        raise ValueError(
            f"window: the sliding-window hybrid mixes exact softmax weights with the features' estimate of "
            f"them; needs a feature map with kernel='softmax', got kernel={feature_map.kernel!r}"
        )
    if cu_seqlens is not None:
        if query_padding_mask is not None:
            raise ValueError("query_padding_mask: not supported with cu_seqlens")
        return varlen.attend_packed(
            rf_attention,
            q,
            k,
            v,
            cu_seqlens,
            query_padding=True,
            feature_map=feature_map,
            causal=causal,
            key_padding_mask=key_padding_mask,
            eps=eps,
            chunk_size=chunk_size,
            window=window,
            backend=backend,
            scale=scale,
        )
    _check_shapes(q, k, v, causal)
    if causal and feature_map.statistics_mode == "batch" and feature_map.running_statistics_defaults():
        raise ValueError(
            f"feature_map: {type(feature_map).__name__} computes statistics over the whole sequence, which "
            "would let a position see later ones; create it with statistics_mode='running' for causal "
            "attention"
        )
    scale = input_scale(q.shape[-1], scale)
    acc = _accumulation_dtype(q, k, v)
    q_in, k_in = q, k
    q, k = q.to(acc), k.to(acc)
    contract = feature_map.contract(
        q,
        k,
        scale=scale,
        key_padding_mask=key_padding_mask,
        query_padding_mask=query_padding_mask,
        dtype=acc,
        closed_form=not window,  # the window's loop takes the callable
    )
    mask = _broadcast_key_mask(key_padding_mask, k)
    features = feature_strategy(contract, q.shape[:-2], acc)
    if window:
        if backend == "triton":
            raise ValueError(
                "backend: the Triton kernels have no sliding window; run window > 0 with backend='auto' or "
                "'torch'"
            )
        assert not isinstance(features, ClosedForm), "asked for the callable"
        kernel = _sliding_window(mask, features, window, scale, window_log_factor(feature_map, acc))
        return _run_in_accumulation_dtype(q, k, v, kernel, eps=eps, chunk_size=chunk_size)
    if uses_triton(backend, q_in, closed_form=None if contract.closed else type(feature_map).__name__):
        from rf_attention.ops.triton.attention import closed_form_attention

        assert isinstance(features, ClosedForm), "uses_triton refuses maps without a closed form"
        eps = torch.finfo(acc).eps if eps is None else eps
        return closed_form_attention(
            q_in, k_in, v, mask, features, causal=causal, eps=eps, chunk_size=chunk_size
        )
    kernel = _chunk_parallel(mask, features, causal=causal, width=contract.width)
    return _run_in_accumulation_dtype(q, k, v, kernel, eps=eps, chunk_size=chunk_size)


def window_log_factor(feature_map: FeatureMap, dtype: torch.dtype) -> torch.Tensor | None:
    """A learned map's log window factor (LoLCATs' mixing, ``rf_attention.ops.window``), or None.

    ``log sigmoid(feature_map.window_logit)`` in ``dtype`` (``()`` or ``(H, 1, 1)`` per head) for a learned
    map, whose ``phi(q) . phi(k)`` estimates nothing and is mixed with the window's exact weights by that
    trained factor; None for a random-feature pair, whose product estimates the window's
    ``exp(q . k / sqrt(Dh))`` itself and shares its normalizer with no factor.
    """
    if isinstance(feature_map, LearnedFeatureMap):
        return feature_map.window_log_factor().to(dtype)
    return None


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name}: expected a floating-point tensor (..., N, D), got {type(x).__name__}")
        if x.dim() < 2 or not x.is_floating_point():
            raise ValueError(
                f"{name}: expected a floating-point tensor (..., N, D), got {x.dtype} of shape "
                f"{tuple(x.shape)} (cast it yourself: integer input is never cast silently)"
            )
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-1] != v.shape[:-1] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            "q, k, v: expected shapes (..., N_q, D), (..., N_k, D), (..., N_k, Dv) with the same leading "
            f"shape, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal: needs as many queries as keys, got {q.shape[-2]} and {k.shape[-2]}")


@overload
def _broadcast_key_mask(mask: torch.Tensor, k: torch.Tensor) -> torch.Tensor: ...
@overload
def _broadcast_key_mask(mask: None, k: torch.Tensor) -> None: ...
def _broadcast_key_mask(mask: torch.Tensor | None, k: torch.Tensor) -> torch.Tensor | None:
    """A ``(B, N_k)`` padding mask broadcast to ``k.shape[:-1]``."""
    if mask is None:
        return None
    if mask.dtype != torch.bool or mask.shape != (k.shape[0], k.shape[-2]):
        raise ValueError(
            f"key_padding_mask: expected a bool tensor of shape (B, N_k) = {(k.shape[0], k.shape[-2])}, "
            f"got {mask.dtype} {tuple(mask.shape)}"
        )
    mask = mask.to(k.device)
    return mask.view(mask.shape[0], *([1] * (k.dim() - 3)), mask.shape[1]).expand(k.shape[:-1])
