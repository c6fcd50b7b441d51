"""Skyformer (Chen et al. 2021): Gaussian-kernel attention approximated by the Nystrom method."""

from __future__ import annotations

from typing import Any

import torch

from rf_attention.baselines._common import (
    StepDraws,
    compute_dtype,
    iterative_pinv,
    key_validity,
    uniform,
    without_autocast,
)
from rf_attention.modules import MultiheadSelfAttention
from rf_attention.registry import register
from spectraformer_core import check_int


def gaussian_kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    r"""The Gaussian kernel matrix $\exp(-\lVert a_i - b_j \rVert^2 / 2)$, ``(..., n, m)``.

    Computed as $\exp(a_i^\top b_j - \lVert a_i \rVert^2 / 2 - \lVert b_j \rVert^2 / 2)$.
    """
    return torch.exp(a @ b.mT - 0.5 * (a * a).sum(-1, keepdim=True) - 0.5 * (b * b).sum(-1).unsqueeze(-2))


def gaussian_kernel_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, key_padding_mask: torch.Tensor | None = None
) -> torch.Tensor:
    r"""Exact Gaussian-kernel ("kernelized") attention of Chen et al. 2021, Eq. 4, in O(N^2).

    $\kappa(q / D_h^{1/4}, k / D_h^{1/4}) \, v$ with $\kappa(a, b) = \exp(-\lVert a - b \rVert^2 / 2)$,
    without row normalization; padded keys contribute nothing. The reference
    [`SkyformerAttention`][rf_attention.SkyformerAttention] approximates.

    Args:
        q: ``(B, H, N_q, Dh)``.
        k: ``(B, H, N_k, Dh)``.
        v: ``(B, H, N_k, Dv)``.
        key_padding_mask: bool ``(B, N_k)``, True at padding.

    Returns:
        ``(B, H, N_q, Dv)``.
    """
    scale = q.shape[-1] ** -0.25
    weights = gaussian_kernel(q * scale, k * scale)
    valid = key_validity(key_padding_mask, k)
    return weights.masked_fill(~valid[:, None, None, :], 0.0) @ v


@register("skyformer")
class SkyformerAttention(StepDraws, MultiheadSelfAttention):
    r"""Skyformer attention: Gaussian-kernel attention approximated by the Nystrom method, O(N m).

    Chen et al. 2021, "Skyformer: Remodel self-attention with Gaussian kernel and Nystrom method", NeurIPS.

    Softmax is replaced by the Gaussian kernel, $C = \kappa(q / D_h^{1/4}, k / D_h^{1/4}) \, v$ (Eq. 4,
    `gaussian_kernel_attention`), and the kernel matrix of the $2N$ points $[q; k]$ (positive
    semi-definite) is approximated by the Nystrom method with $m$ landmark points $L$ drawn uniformly from
    them (Section 4, Eq. 6):

    $$
    C \approx \kappa(q, L) \, (\kappa(L, L) + \text{ridge} \cdot I)^+ \, \kappa(L, k) \, v
    $$

    Following the authors' LRA code (which the Spectraformer paper runs): half of the landmarks are drawn
    from the queries and half from the keys, among real tokens only; padded queries, keys and values are
    set to zero; ``ridge = 0.1``; the landmark matrix is normalized symmetrically by its row sums
    ($D^{-1/2} A D^{-1/2}$, which leaves the product unchanged) and inverted by the iterative pseudo-inverse
    of Nystromformer (6 iterations, scaled per matrix here). Departures: the landmarks are drawn without
    replacement (the code draws with replacement) and from the real tokens wherever the padding is (the
    code assumes padding at the end); with ``m >= 2N`` every point is a landmark. Landmarks are drawn
    afresh at every training step and kept in eval ([`StepDraws`][rf_attention.baselines.StepDraws]).

    No causal form (landmarks come from the whole sequence).

    Args:
        num_features: the budget: number of landmarks ``m``.
        num_landmarks: overrides ``num_features``.
        pinv_iterations: iterations of the pseudo-inverse.
        ridge: added to the diagonal of the landmark kernel matrix before inverting.
        seed: seeds the landmark draws and the projections.
        **kw: [`MultiheadSelfAttention`][rf_attention.MultiheadSelfAttention] arguments.
    """

    supports_causal = False

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        num_features: int = 128,
        num_landmarks: int | None = None,
        pinv_iterations: int = 6,
        ridge: float = 0.1,
        seed: int | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(dim, num_heads, seed=seed, **kw)
        self.num_landmarks = check_int(
            "num_landmarks", num_features if num_landmarks is None else num_landmarks, 1
        )
        self.pinv_iterations = check_int("pinv_iterations", pinv_iterations, 0)
        if not ridge >= 0:
            raise ValueError(f"ridge: expected a number >= 0, got {ridge!r}")
        self.ridge = float(ridge)
        self.init_draws(seed)

    def landmark_indices(self, valid: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Landmark indices ``(B, m)`` into the ``2N`` points ``[q; k]``, drawn from ``generator``.

        ``m // 2`` queries and the rest keys, drawn uniformly without replacement among the real tokens
        (padding only when too few are real); all ``2N`` points when ``m >= 2N``.
        """
        b, n = valid.shape
        if self.num_landmarks >= 2 * n:
            return torch.arange(2 * n, device=valid.device).expand(b, 2 * n)
        num_q = self.num_landmarks // 2
        picks = []
        for offset, count in ((0, num_q), (n, self.num_landmarks - num_q)):
            # Real tokens draw keys in [0, 1), padding in [2, 3): the smallest come from real tokens first.
            keys = uniform((b, n), generator, valid.device) + 2.0 * (~valid)
            picks.append(keys.topk(count, dim=-1, largest=False).indices + offset)
        return torch.cat(picks, dim=-1)

    @without_autocast
    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Nystrom approximation of Eq. 4 on ``q, k, v (B, H, N, Dh)`` -> ``(B, H, N, Dh)``."""
        out_dtype, dtype = v.dtype, compute_dtype(v)
        valid = key_validity(key_padding_mask, q)
        keep = valid[:, None, :, None].to(dtype)
        scale = q.shape[-1] ** -0.25
        q, k, v = q.to(dtype) * (scale * keep), k.to(dtype) * (scale * keep), v.to(dtype) * keep
        points = torch.cat([q, k], dim=-2)  # (B, H, 2N, Dh)
        index = self.landmark_indices(valid, self.step_generator())[:, None, :, None].expand(
            -1, q.shape[1], -1, q.shape[-1]
        )
        landmarks = points.gather(-2, index)  # (B, H, m, Dh)
        inner = gaussian_kernel(landmarks, landmarks)
        inner = inner + self.ridge * torch.eye(inner.shape[-1], dtype=dtype, device=inner.device)
        d = inner.sum(dim=-1).rsqrt()  # row sums of a positive matrix: positive
        inner_pinv = iterative_pinv(d.unsqueeze(-1) * inner * d.unsqueeze(-2), self.pinv_iterations)
        right = ((gaussian_kernel(k, landmarks) * d.unsqueeze(-2)) @ inner_pinv) * d.unsqueeze(-2)
        right = right * keep  # (B, H, N, m); padded keys contribute nothing
        out = gaussian_kernel(q, landmarks) @ (right.mT @ v)
        return out.to(out_dtype)

    def extra_repr(self) -> str:
        """Landmarks, iterations and ridge shown by ``repr``."""
        return (
            f"{super().extra_repr()}, num_landmarks={self.num_landmarks}, "
            f"pinv_iterations={self.pinv_iterations}, ridge={self.ridge}"
        )
