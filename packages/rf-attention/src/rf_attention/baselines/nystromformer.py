"""Nystromformer (Xiong et al. 2021): Nystrom approximation of softmax attention, segment-mean landmarks."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rf_attention.baselines._common import (
    compute_dtype,
    iterative_pinv,
    key_validity,
    masked_softmax,
    without_autocast,
)
from rf_attention.modules import MultiheadSelfAttention
from rf_attention.registry import register
from spectraformer_core import check_int, make_generator


def segment_means(x: torch.Tensor, valid: torch.Tensor, num_segments: int) -> torch.Tensor:
    """Means of ``num_segments`` contiguous segments of ``x (B, H, N, D)`` over its valid rows.

    Segment ``j`` holds positions ``i`` with ``floor(i m / N) = j`` (equal lengths when ``m`` divides
    ``N``); padded positions (``valid (B, N)`` False) are left out of the mean, and a segment of padding
    only gives the zero vector.

    Returns:
        ``(B, H, m, D)``.
    """
    b, h, n, d = x.shape
    weights = valid.to(x.dtype)[:, None, :, None]
    if n % num_segments == 0:
        size = n // num_segments
        sums = (x * weights).reshape(b, h, num_segments, size, d).sum(dim=-2)
        counts = weights.reshape(b, 1, num_segments, size, 1).sum(dim=-2)
    else:
        bounds = (torch.arange(num_segments + 1, device=x.device) * n + num_segments - 1) // num_segments
        zero = x.new_zeros(b, h, 1, d)
        cum = torch.cat([zero, (x * weights).cumsum(dim=-2)], dim=-2)
        cum_w = torch.cat([weights.new_zeros(b, 1, 1, 1), weights.cumsum(dim=-2)], dim=-2)
        sums = cum[:, :, bounds[1:]] - cum[:, :, bounds[:-1]]
        counts = cum_w[:, :, bounds[1:]] - cum_w[:, :, bounds[:-1]]
    return sums / counts.clamp_min(1.0)


@register("nystromformer")
class NystromformerAttention(MultiheadSelfAttention):
    r"""Nystromformer attention: a Nystrom approximation of softmax attention with ``m`` landmarks, O(N m).

    Xiong et al. 2021, "Nystromformer: A Nystrom-based algorithm for approximating self-attention", AAAI.

    With $q, k$ scaled by $D_h^{-1/4}$ each and landmarks $\tilde q, \tilde k$ ``(m, Dh)`` (segment means of
    the queries and keys, Section 3.3), softmax attention is approximated by (Eq. 14):

    $$
    \operatorname{softmax}(q \tilde k^\top) \, \bigl(\operatorname{softmax}(\tilde q \tilde k^\top)\bigr)^+
    \operatorname{softmax}(\tilde q k^\top) \, v \quad [+ \text{depthwise conv of } v]
    $$

    with $(\cdot)^+$ the iterative Moore-Penrose pseudo-inverse of Eq. 16 (`iterative_pinv`) and a
    depthwise convolution of the values over the sequence added as a skip connection (Section 4, as in
    the authors' LRA code). Padded keys take no part in the landmarks nor in
    $\operatorname{softmax}(\tilde q k^\top)$.

    Choices of the Skyformer/LRA benchmark code followed: padded queries and keys are set to zero, only
    $\operatorname{softmax}(\tilde q k^\top)$ is masked, 6 pseudo-inverse iterations. Departures: landmarks
    are means over the segment's real tokens (the benchmark code averages zeros in), any $N$ is accepted
    (segments of $\lfloor N / m \rfloor$ or $\lceil N / m \rceil$ tokens; the code needs $m \mid N$), the
    pseudo-inverse is scaled per matrix (as in the paper; the code uses one scale for the batch). The
    Skyformer LRA configuration has no convolution: pass ``conv_kernel_size=None`` to reproduce it.

    No causal form (landmarks average over the whole sequence).

    Args:
        num_features: the budget: number of landmarks ``m`` (``min(m, N)`` are used).
        num_landmarks: overrides ``num_features``.
        pinv_iterations: iterations of the pseudo-inverse.
        conv_kernel_size: odd length of the depthwise convolution over the sequence (per head), or None
            for no convolution.
        seed: seeds the initial values of the convolution and the projections.
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
        conv_kernel_size: int | None = 35,
        seed: int | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(dim, num_heads, seed=seed, **kw)
        self.num_landmarks = check_int(
            "num_landmarks", num_features if num_landmarks is None else num_landmarks, 1
        )
        self.pinv_iterations = check_int("pinv_iterations", pinv_iterations, 0)
        if conv_kernel_size is not None and (check_int("conv_kernel_size", conv_kernel_size, 1) % 2 == 0):
            raise ValueError(f"conv_kernel_size: expected an odd integer or None, got {conv_kernel_size}")
        self.conv_kernel_size = conv_kernel_size
        generator = make_generator(seed, None)
        if conv_kernel_size is None:
            self.conv = None
        else:
            self.conv = nn.Parameter(torch.empty(num_heads, 1, conv_kernel_size, 1))
            # nn.Conv2d's default initialization, drawn from the seeded generator.
            nn.init.kaiming_uniform_(self.conv, a=5**0.5, generator=generator)

    @without_autocast
    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Eq. 14 on ``q, k, v (B, H, N, Dh)`` -> ``(B, H, N, Dh)``."""
        out_dtype, dtype = v.dtype, compute_dtype(v)
        valid = key_validity(key_padding_mask, q)
        keep = valid[:, None, :, None].to(dtype)
        scale = q.shape[-1] ** -0.25
        q, k, v = q.to(dtype) * (scale * keep), k.to(dtype) * (scale * keep), v.to(dtype) * keep
        m = min(self.num_landmarks, q.shape[-2])
        q_land, k_land = segment_means(q, valid, m), segment_means(k, valid, m)
        kernel_1 = torch.softmax(q @ k_land.mT, dim=-1)  # (B, H, N, m)
        kernel_2 = torch.softmax(q_land @ k_land.mT, dim=-1)  # (B, H, m, m)
        kernel_3, _ = masked_softmax(q_land @ k.mT, valid[:, None, None, :])  # (B, H, m, N)
        out = (kernel_1 @ iterative_pinv(kernel_2, self.pinv_iterations)) @ (kernel_3 @ v)
        if self.conv is not None:
            assert self.conv_kernel_size is not None, "conv exists only with a kernel size"
            out = out + F.conv2d(
                v,
                self.conv.to(dtype),
                padding=(self.conv_kernel_size // 2, 0),
                groups=self.num_heads,
            )
        return out.to(out_dtype)

    def extra_repr(self) -> str:
        """Landmarks, iterations and convolution shown by ``repr``."""
        return (
            f"{super().extra_repr()}, num_landmarks={self.num_landmarks}, "
            f"pinv_iterations={self.pinv_iterations}, conv_kernel_size={self.conv_kernel_size}"
        )
