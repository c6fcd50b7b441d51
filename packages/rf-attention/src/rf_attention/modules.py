"""Multi-head self-attention modules: the shared projections, exact softmax, and random-feature attention."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import rf_features
from rf_attention.functional import rf_attention, softmax_attention


class MultiheadSelfAttention(nn.Module):
    """Multi-head self-attention ``(B, N, dim) -> (B, N, dim)``: projections around an attention kernel.

    ``q, k, v = x W_qkv`` split into ``num_heads`` heads of ``dim / num_heads``; subclasses implement
    [`attend`][rf_attention.MultiheadSelfAttention.attend] on ``(B, H, N, Dh)`` tensors; the heads are merged
    and projected back, then dropout.

    Args:
        dim: model width.
        num_heads: heads; must divide ``dim``.
        causal: query ``i`` attends to positions ``j <= i`` only.
        dropout: dropout on the output projection (training only).
        bias: biases in the projections.
    """

    #: False for attentions without a causal form (``create(..., causal=True)`` then raises).
    supports_causal: bool = True

    def __init__(
        self, dim: int, num_heads: int, *, causal: bool = False, dropout: float = 0.0, bias: bool = True
    ) -> None:
        super().__init__()
        if num_heads < 1 or dim % num_heads:
            raise ValueError(f"num_heads: expected a divisor of dim={dim}, got {num_heads}")
        if causal and not self.supports_causal:
            raise ValueError(f"causal: {type(self).__name__} has no causal form; use causal=False")
        self.dim, self.num_heads, self.head_dim, self.causal = dim, num_heads, dim // num_heads, causal
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Attention on heads: ``q, k, v (B, H, N, Dh)`` -> ``(B, H, N, Dh)``."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x (B, N, dim)``, ``key_padding_mask (B, N)`` bool (True = padding) -> ``(B, N, dim)``."""
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x: expected shape (B, N, {self.dim}), got {tuple(x.shape)}")
        if key_padding_mask is not None and (
            key_padding_mask.dtype != torch.bool or key_padding_mask.shape != x.shape[:2]
        ):
            raise ValueError(
                f"key_padding_mask: expected a bool tensor of shape {tuple(x.shape[:2])}, "
                f"got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
            )
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        out = self.attend(q, k, v, key_padding_mask)
        return self.dropout(self.proj(out.transpose(1, 2).reshape(b, n, self.dim)))

    def extra_repr(self) -> str:
        """Width, heads and causality shown by ``repr``."""
        return f"dim={self.dim}, num_heads={self.num_heads}, causal={self.causal}"


class SoftmaxAttention(MultiheadSelfAttention):
    """Exact softmax attention (the original Transformer; SDPA underneath), O(N^2).

    Args:
        attention_dropout: dropout on the attention probabilities (training only).
        **kw: [`MultiheadSelfAttention`][rf_attention.MultiheadSelfAttention] arguments.
    """

    def __init__(self, dim: int, num_heads: int, *, attention_dropout: float = 0.0, **kw: Any) -> None:
        super().__init__(dim, num_heads, **kw)
        self.attention_dropout = attention_dropout

    def attend(self, q, k, v, key_padding_mask):
        """[`softmax_attention`][rf_attention.softmax_attention]."""
        dropout_p = self.attention_dropout if self.training else 0.0
        return softmax_attention(
            q, k, v, causal=self.causal, key_padding_mask=key_padding_mask, dropout_p=dropout_p
        )


class RandomFeatureAttention(MultiheadSelfAttention):
    """Kernelized attention with a random feature map shared by the heads (Spectraformer, Figure 1), O(N).

    Args:
        component: an ``rf_features`` component name (``"oprf"``, ...).
        weight_matrix: an ``rf_matrices`` weight matrix name (``"fastfoodl"``, ...).
        num_features: rows ``s`` of the weight matrix.
        seed: seed of the weight matrix (and of its redraws).
        kernel: ``"softmax"`` (approximates softmax attention) or ``"gaussian"`` (Skyformer-style).
        redraw_interval: redraw the random features before every ``redraw_interval``-th training forward
            pass (calls ``k, 2k, ...`` counting from 0); never in eval; 0 = never. Learned matrices
            (``fastfoodl``) are never redrawn.
        matrix_options: extra keyword arguments for the weight matrix (``{"learn_gb": True}``).
        **kw: [`MultiheadSelfAttention`][rf_attention.MultiheadSelfAttention] arguments.

    In causal mode the feature map's data-dependent parameters (OPRF's ``A``, SADERF's ``Psi``) come from
    running averages over earlier training batches (``statistics_mode="running"``): nothing computed for a
    position depends on later positions.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        component: str,
        weight_matrix: str,
        num_features: int = 128,
        seed: int | None = None,
        kernel: str = "softmax",
        redraw_interval: int = 0,
        matrix_options: dict | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(dim, num_heads, **kw)
        if redraw_interval < 0:
            raise ValueError(f"redraw_interval: expected an integer >= 0, got {redraw_interval}")
        self.feature_map = rf_features.create(
            component,
            weight_matrix=weight_matrix,
            num_features=num_features,
            dim=self.head_dim,
            seed=seed,
            kernel=kernel,
            matrix_options=matrix_options,
            statistics_mode="running" if self.causal else "batch",
        )
        self.redraw_interval = redraw_interval
        self.register_buffer("training_calls", torch.zeros((), dtype=torch.long))

    def attend(self, q, k, v, key_padding_mask):
        """[`rf_attention`][rf_attention.rf_attention] with this module's feature map."""
        if self.training:
            calls = int(self.training_calls)
            if self.redraw_interval and calls and calls % self.redraw_interval == 0:
                self.feature_map.redraw()
            self.training_calls += 1
        return rf_attention(
            q,
            k,
            v,
            self.feature_map,
            causal=self.causal,
            key_padding_mask=key_padding_mask,
            query_padding_mask=key_padding_mask,
        )
