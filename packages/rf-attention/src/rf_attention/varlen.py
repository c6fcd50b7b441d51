r"""Packed (variable-length) sequences: several sequences concatenated along the token axis.

``cu_seqlens`` follows flash-attn's and fla's convention: int32 cumulative starts
``[0, n_1, n_1 + n_2, ..., T]`` of ``B`` sequences packed into ``T`` tokens. The attention functions take
packed ``(1, H, T, D)`` tensors with ``cu_seqlens=`` and give each sequence exactly what it would get alone:
the tokens are gathered into a right-padded ``(B, H, max n_b, D)`` batch by index arithmetic (one
``index_copy``, no per-sequence loop), attended once with a key padding mask, and scattered back. Per-row
statistics of the feature maps (OPRF's $A$, SADERF's $\Psi$ in ``"batch"`` mode) are then per sequence.
The padded batch costs ``B * max n_b`` positions of work; packs of very unequal lengths waste the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackedLayout:
    """Where each packed token goes in the right-padded batch.

    Attributes:
        lengths: ``(B,)`` tokens per sequence.
        max_length: the longest sequence (the padded batch's width).
        index: ``(T,)`` flat position ``b * max_length + offset`` of each packed token.
        padding: bool ``(B, max_length)``, True past each sequence's end.
    """

    lengths: torch.Tensor
    max_length: int
    index: torch.Tensor
    padding: torch.Tensor

    @classmethod
    def from_cu_seqlens(cls, cu_seqlens: torch.Tensor, total: int) -> PackedLayout:
        """The layout of ``total`` tokens split by ``cu_seqlens`` (``(B + 1,)``, 0 first, ``total`` last).

        Raises:
            ValueError: ``cu_seqlens`` is not an increasing 1D integer tensor from 0 to ``total``.
        """
        if (
            not isinstance(cu_seqlens, torch.Tensor)
            or cu_seqlens.dim() != 1
            or cu_seqlens.numel() < 2
            or cu_seqlens.is_floating_point()
        ):
            raise ValueError(
                "cu_seqlens: expected a 1D integer tensor of cumulative starts [0, n_1, ..., T], got "
                f"{getattr(cu_seqlens, 'dtype', type(cu_seqlens).__name__)} of shape "
                f"{tuple(getattr(cu_seqlens, 'shape', ()))}"
            )
        cu = cu_seqlens.long()
        lengths = cu.diff()
        if int(cu[0]) != 0 or int(cu[-1]) != total or bool((lengths <= 0).any()):
            raise ValueError(
                f"cu_seqlens: expected increasing starts from 0 to the {total} packed tokens, got "
                f"{cu_seqlens.tolist()}"
            )
        max_length = int(lengths.max())
        token = torch.arange(total, device=cu.device)
        sequence = torch.searchsorted(cu[1:], token, right=True)
        index = sequence * max_length + (token - cu[sequence])
        padding = torch.arange(max_length, device=cu.device) >= lengths.unsqueeze(-1)
        return cls(lengths=lengths, max_length=max_length, index=index, padding=padding)

    @property
    def num_sequences(self) -> int:
        """``B``."""
        return int(self.lengths.numel())

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """Packed ``x (1, *mid, T, D)`` as the right-padded ``(B, *mid, max_length, D)`` (zeros past ends)."""
        inner = x[0]
        mid = inner.shape[:-2]
        flat = inner.new_zeros(*mid, self.num_sequences * self.max_length, inner.shape[-1])
        flat = flat.index_copy(-2, self.index.to(x.device), inner)
        flat = flat.view(*mid, self.num_sequences, self.max_length, inner.shape[-1])
        return flat.movedim(-3, 0)

    def pack(self, y: torch.Tensor) -> torch.Tensor:
        """The padded batch ``y (B, *mid, max_length, D)`` back to packed ``(1, *mid, T, D)``."""
        flat = y.movedim(0, -3)
        flat = flat.reshape(*flat.shape[:-3], self.num_sequences * self.max_length, y.shape[-1])
        return flat.index_select(-2, self.index.to(y.device)).unsqueeze(0)


def attend_packed(
    attention: Callable[..., torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    key_log_scale: torch.Tensor | None = None,
    query_padding: bool = False,
    **kwargs: object,
) -> torch.Tensor:
    """``attention`` of each packed sequence alone, run once on the padded batch.

    Args:
        q: ``(1, H, T, Dq)`` packed queries (``(1, *mid, T, Dq)`` in general).
        k: ``(1, H, T, Dk)`` packed keys.
        v: ``(1, H, T, Dv)`` packed values.
        attention: ``rf_attention``, ``linear_attention`` or ``softmax_attention`` (called once on the
            padded batch with ``key_padding_mask``).
        cu_seqlens: ``(B + 1,)`` cumulative starts (the same for queries and keys).
        key_log_scale: ``(1, H, T)`` for ``linear_attention``; unpacked like the keys.
        query_padding: also pass the padding as ``query_padding_mask`` (``rf_attention``'s statistics).
        **kwargs: more keyword arguments of ``attention`` (``causal``, ``feature_map``, ...).

    Returns:
        ``(1, H, T, Dv)``.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() < 3 or x.shape[0] != 1:
            raise ValueError(
                f"{name}: with cu_seqlens, expected packed sequences of shape (1, ..., T, D), got "
                f"{tuple(getattr(x, 'shape', ()))}"
            )
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"cu_seqlens: packs queries and keys alike; got {q.shape[-2]} queries and {k.shape[-2]} keys"
        )
    if kwargs.pop("key_padding_mask", None) is not None:
        raise ValueError("key_padding_mask: not supported with cu_seqlens (packed sequences have no padding)")
    layout = PackedLayout.from_cu_seqlens(cu_seqlens, q.shape[-2])
    padding = layout.padding.to(q.device)
    extra: dict[str, object] = dict(kwargs)
    if key_log_scale is not None:
        scales = layout.unpack(key_log_scale.unsqueeze(-1)).squeeze(-1)
        extra["key_log_scale"] = scales.masked_fill(_broadcast(padding, scales), -math.inf)
    if query_padding:
        extra["query_padding_mask"] = padding
    out = attention(layout.unpack(q), layout.unpack(k), layout.unpack(v), key_padding_mask=padding, **extra)
    return layout.pack(out)


def _broadcast(padding: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``(B, N)`` padding broadcast to ``like (B, *mid, N)``."""
    return padding.view(padding.shape[0], *([1] * (like.dim() - 2)), padding.shape[1]).expand(like.shape)
