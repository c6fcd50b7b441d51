"""Linformer (Wang et al. 2020): softmax attention over keys and values projected to a fixed length k."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rf_attention.baselines._common import (
    compute_dtype,
    key_validity,
    without_autocast,
)
from rf_attention.modules import MultiheadSelfAttention
from rf_attention.registry import register
from spectraformer_core import check_int, make_generator


@register("linformer")
class LinformerAttention(MultiheadSelfAttention):
    r"""Linformer attention: softmax attention over keys and values projected to length ``k``, O(N k).

    Wang et al. 2020, "Linformer: Self-attention with linear complexity".

    Learned projections $E, F$ ``(k, max_seq_len)`` per head shorten the keys and values along the sequence
    (Eq. 7):

    $$
    \operatorname{softmax}\bigl(q (E k)^\top / \sqrt{D_h}\bigr) \, (F v)
    $$

    A sequence of $N \le$ ``max_seq_len`` tokens uses the first $N$ columns of $E$ and $F$.
    Following the Skyformer/LRA benchmark code: one projection per head, initialized from
    $\mathcal{N}(0, 0.02^2)$, padded keys and values set to zero before projecting (so padding changes
    nothing).
    The paper's option of one projection for keys and values is ``share_kv=True`` (the benchmark code
    shares; the paper's default and ours keep ``E`` and ``F`` apart).

    No causal form (every projected key mixes the whole sequence).

    Args:
        num_features: the budget: projected length ``k``.
        max_seq_len: the longest sequence; longer ones raise a ``ValueError``.
        share_kv: one projection ``E = F``.
        seed: seeds the initial values of ``E``, ``F`` and the projections.
        **kw: [`MultiheadSelfAttention`][rf_attention.MultiheadSelfAttention] arguments.
    """

    supports_causal = False

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        num_features: int = 128,
        max_seq_len: int = 4096,
        share_kv: bool = False,
        seed: int | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(dim, num_heads, seed=seed, **kw)
        self.projected_length = check_int("num_features", num_features, 1)
        self.max_seq_len = check_int("max_seq_len", max_seq_len, 1)
        generator = make_generator(seed, None)
        self.E = nn.Parameter(torch.empty(num_heads, num_features, max_seq_len))
        nn.init.normal_(self.E, std=0.02, generator=generator)
        if share_kv:
            self.F = None
        else:
            self.F = nn.Parameter(torch.empty(num_heads, num_features, max_seq_len))
            nn.init.normal_(self.F, std=0.02, generator=generator)

    @without_autocast
    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Eq. 7 on ``q, k, v (B, H, N, Dh)`` -> ``(B, H, N, Dh)``."""
        n = q.shape[-2]
        if n > self.max_seq_len:
            raise ValueError(
                f"x: sequence length {n} exceeds max_seq_len={self.max_seq_len} of this Linformer; "
                "create it with max_seq_len >= the longest sequence"
            )
        out_dtype, dtype = v.dtype, compute_dtype(v)
        valid = key_validity(key_padding_mask, q)
        keep = valid[:, None, :, None].to(dtype)
        e = self.E[..., :n].to(dtype)
        f = e if self.F is None else self.F[..., :n].to(dtype)
        k_proj, v_proj = e @ (k.to(dtype) * keep), f @ (v.to(dtype) * keep)  # (B, H, k, Dh)
        scores = (q.to(dtype) @ k_proj.mT) * q.shape[-1] ** -0.5
        return (torch.softmax(scores, dim=-1) @ v_proj).to(out_dtype)

    def extra_repr(self) -> str:
        """Projected length and maximum length shown by ``repr``."""
        return (
            f"{super().extra_repr()}, projected_length={self.projected_length}, "
            f"max_seq_len={self.max_seq_len}, share_kv={self.F is None}"
        )
