"""Plain quadratic references that the fast attention paths are tested against (outputs and gradients).

Every function here builds the ``N_q x N_k`` matrix explicitly, applies masks by zeroing (or ``-inf``),
normalizes by the row sum and has no stabilization, chunking or guard: obviously right, quadratic in
memory, and meant for float64 on small sizes.
"""

from __future__ import annotations

import math

import torch

from rf_attention.ops.features import qk_scale
from rf_features import FeatureMap, LearnedFeatureMap


def _allowed(
    n_q: int, key_padding_mask: torch.Tensor | None, causal: bool, like: torch.Tensor
) -> torch.Tensor | None:
    """Bool ``(B, 1, N_q, N_k)`` (or ``(N_q, N_k)``): True where query ``i`` may attend to key ``j``."""
    n_k = like.shape[-2]
    allowed = None
    if key_padding_mask is not None:
        mask = key_padding_mask.to(like.device)
        allowed = (
            (~mask).view(mask.shape[0], *([1] * (like.dim() - 2)), n_k).expand(*like.shape[:-2], n_q, n_k)
        )
    if causal:
        lower = torch.ones(n_q, n_k, dtype=torch.bool, device=like.device).tril()
        allowed = lower if allowed is None else allowed & lower
    return allowed


def naive_linear_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""$D^{-1} (\phi_q \phi_k^\top) v$ with the ``N_q x N_k`` matrix built (Eq. 7); rows without keys give 0.

    Args:
        phi_q: ``[B, H, N_q, m]`` (or ``[..., N_q, m]``).
        phi_k: ``[B, H, N_k, m]``.
        v: ``[B, H, N_k, Dv]``.
        causal: query $i$ sees keys $j \le i$.
        key_padding_mask: bool ``[B, N_k]``, True at padding.

    Returns:
        ``[B, H, N_q, Dv]``.
    """
    scores = phi_q @ phi_k.mT
    allowed = _allowed(phi_q.shape[-2], key_padding_mask, causal, phi_k)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, 0.0)
    den = scores.sum(-1, keepdim=True)
    if allowed is None:
        return (scores @ v) / den
    empty = ~allowed.any(-1, keepdim=True)
    return ((scores @ v) / den.masked_fill(empty, 1.0)).masked_fill(empty, 0.0)


def naive_rf_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    feature_map: FeatureMap,
    *,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    query_padding_mask: torch.Tensor | None = None,
    window: int = 0,
) -> torch.Tensor:
    r"""Random-feature attention from the unstabilized features of $q D_h^{-1/4}$ and $k D_h^{-1/4}$.

    The features are ``feature_map(q Dh^-1/4, k Dh^-1/4)`` with no rescaling (so this overflows where
    $\exp(q \cdot k / \sqrt{D_h})$ does: use float64), combined by
    [`naive_linear_attention`][rf_attention.ops.naive.naive_linear_attention]. The feature map's statistics
    (OPRF's $A$, SADERF's $\Psi$) are its own, computed without gradient.

    Args:
        q: ``[B, H, N_q, Dh]``.
        k: ``[B, H, N_k, Dh]``.
        v: ``[B, H, N_k, Dv]``.
        feature_map: an ``rf_features.FeatureMap`` of dimension ``Dh``.
        causal: query $i$ sees keys $j \le i$.
        key_padding_mask: bool ``[B, N_k]``, True at padding.
        query_padding_mask: bool ``[B, N_q]``, True at padding (left out of the statistics).
        window: the sliding-window hybrid (``causal`` only): the entries $j \in (i - w, i]$ of the
            ``N_q x N_k`` matrix are the exact $\exp(q_i \cdot k_j / \sqrt{D_h})$, the others
            $\phi(q_i) \cdot \phi(k_j)$; 0: random features only. For a learned map
            (``rf_features.LearnedFeatureMap``) the window's entries are LoLCATs'
            $f\, \exp(s_{ij} - m_i)$ instead, $f = \sigma$(``feature_map.window_logit``) per head (a map
            created with ``window_factor=True``) and
            $m_i$ the largest $s_{ij}$ over the keys in query $i$'s window.

    Returns:
        ``[B, H, N_q, Dv]``.
    """
    scale = qk_scale(q.shape[-1])
    phi_q, phi_k = feature_map(
        q * scale, k * scale, key_padding_mask=key_padding_mask, query_padding_mask=query_padding_mask
    )
    if not window:
        return naive_linear_attention(phi_q, phi_k, v, causal=causal, key_padding_mask=key_padding_mask)
    if not causal:
        raise ValueError(f"window: needs causal=True, got window={window} with causal=False")
    positions = torch.arange(q.shape[-2], device=q.device)
    distance = positions.unsqueeze(-1) - torch.arange(k.shape[-2], device=q.device)
    band = (distance >= 0) & (distance < window)
    allowed = _allowed(q.shape[-2], key_padding_mask, causal, k)
    assert allowed is not None, "causal"
    logits = q @ k.mT / math.sqrt(q.shape[-1])
    exact = torch.exp(logits)
    if isinstance(feature_map, LearnedFeatureMap):
        in_window = logits.masked_fill(~(band & allowed), -math.inf)
        top = in_window.amax(-1, keepdim=True)
        top = torch.where(top.isfinite(), top, torch.zeros_like(top))  # a window of padding: no entry
        exact = feature_map.window_log_factor().exp() * torch.exp(logits - top)  # sigmoid(window_logit)
    scores = torch.where(band, exact, phi_q @ phi_k.mT)
    scores = scores.masked_fill(~allowed, 0.0)
    empty = ~allowed.any(-1, keepdim=True)
    den = scores.sum(-1, keepdim=True).masked_fill(empty, 1.0)
    return ((scores @ v) / den).masked_fill(empty, 0.0)


def naive_softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""$\operatorname{softmax}(q k^\top / \sqrt{D_h})\, v$ with the matrix built (Eq. 6).

    Rows without keys give 0.

    Args:
        q: ``[B, H, N_q, Dh]``.
        k: ``[B, H, N_k, Dh]``.
        v: ``[B, H, N_k, Dv]``.
        causal: query $i$ sees keys $j \le i$.
        key_padding_mask: bool ``[B, N_k]``, True at padding.

    Returns:
        ``[B, H, N_q, Dv]``.
    """
    scores = q @ k.mT / math.sqrt(q.shape[-1])
    allowed = _allowed(q.shape[-2], key_padding_mask, causal, k)
    if allowed is None:
        return scores.softmax(-1) @ v
    scores = scores.masked_fill(~allowed, -math.inf)
    empty = ~allowed.any(-1, keepdim=True)
    return (scores.masked_fill(empty, 0.0).softmax(-1) @ v).masked_fill(empty, 0.0)
