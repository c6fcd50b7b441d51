r"""Token-by-token decoding: the recurrent state of causal RF attention and the KV cache of softmax attention.

Causal kernelized attention (Eq. 7 with the sums over $j \le i$) is a recurrence: after $t$ tokens,
everything later queries need is the ``m x (Dv + 1)`` sums $\sum_j \phi_{k_j}^\top [v_j, 1]$ (numerator and
normalizer) relative to a running log-scale, whatever $t$ is ($O(1)$ memory and time per token):
[`RecurrentState`][rf_attention.ops.recurrent.RecurrentState], advanced by
[`decode`][rf_attention.ops.recurrent.decode] (both re-exported here). Exact softmax attention has no
such state: it keeps every key and value ([`KVCache`][rf_attention.decoding.KVCache], O(t) per token). The
sliding-window hybrid keeps both kinds, bounded: the feature sums of the keys older than its window and a ring
of the last ``w`` keys and values ([`WindowState`][rf_attention.ops.window.WindowState], advanced by
[`decode_window`][rf_attention.ops.recurrent.decode_window]).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rf_attention.ops.recurrent import RecurrentState, decode, decode_window
from rf_attention.ops.window import WindowState

__all__ = ["KVCache", "RecurrentState", "WindowState", "decode", "decode_window"]


@dataclass
class KVCache:
    """The keys and values of exact softmax attention seen so far, in buffers that grow by doubling.

    Attributes:
        keys: ``(B, H, capacity, Dh)``; the first ``length`` positions are filled.
        values: ``(B, H, capacity, Dv)``.
        padding: bool ``(B, capacity)``, True at padded positions.
        length: tokens seen, padding included.
    """

    keys: torch.Tensor
    values: torch.Tensor
    padding: torch.Tensor
    length: int = 0

    @classmethod
    def empty(cls, like_k: torch.Tensor, like_v: torch.Tensor, capacity: int = 16) -> KVCache:
        """An empty cache for keys like ``like_k (B, H, *, Dh)`` and values like ``like_v (B, H, *, Dv)``."""
        b, h = like_k.shape[:2]
        return cls(
            keys=like_k.new_empty(b, h, capacity, like_k.shape[-1]),
            values=like_v.new_empty(b, h, capacity, like_v.shape[-1]),
            padding=torch.zeros(b, capacity, dtype=torch.bool, device=like_k.device),
        )

    def nbytes(self) -> int:
        """Bytes allocated (O(length): the capacity is at most twice ``length`` once it exceeds 16)."""
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values, self.padding))

    def check_fits(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """A ``ValueError`` unless new keys ``k (B, H, T, Dh)`` and values ``v`` can extend this cache."""
        for name, new, held in (("keys", k, self.keys), ("values", v, self.values)):
            if new.shape[:2] != held.shape[:2] or new.shape[-1] != held.shape[-1] or new.dtype != held.dtype:
                raise ValueError(
                    f"state: expected a KVCache for {name} of shape (B, H, *, D) = "
                    f"{(*new.shape[:2], '*', new.shape[-1])} and dtype {new.dtype}, got "
                    f"{(*held.shape[:2], '*', held.shape[-1])} {held.dtype}"
                )

    def append(self, k: torch.Tensor, v: torch.Tensor, padding: torch.Tensor | None = None) -> KVCache:
        """Add ``T`` positions (``k (B, H, T, Dh)``, ``v``, ``padding (B, T)`` or None), in place."""
        self.check_fits(k, v)
        stop = self.length + k.shape[-2]
        if stop > self.keys.shape[-2]:
            capacity = max(stop, 2 * self.keys.shape[-2])
            self.keys = _grown(self.keys, capacity, self.length, dim=-2)
            self.values = _grown(self.values, capacity, self.length, dim=-2)
            self.padding = _grown(self.padding, capacity, self.length, dim=-1)
        self.keys[..., self.length : stop, :] = k
        self.values[..., self.length : stop, :] = v
        self.padding[:, self.length : stop] = False if padding is None else padding
        self.length = stop
        return self

    def attend(self, q: torch.Tensor) -> torch.Tensor:
        """Softmax attention of the last ``T`` positions' queries ``q (B, H, T, Dh)`` over the cache (Eq. 6).

        Query ``i`` (position ``length - T + i``) sees the cached keys up to its own position that are not
        padding; a query that sees none gives zeros (as
        [`softmax_attention`][rf_attention.softmax_attention]).
        """
        keys, values = self.keys[..., : self.length, :], self.values[..., : self.length, :]
        t, padding = q.shape[-2], self.padding[:, : self.length]
        if t == 1 and not bool(padding.any()):
            return F.scaled_dot_product_attention(q, keys, values)
        positions = torch.arange(self.length, device=q.device)
        allowed = positions <= positions[-t:].unsqueeze(-1)  # (T, length)
        allowed = allowed & ~padding[:, None, None, :]  # (B, 1, T, length)
        empty = ~allowed.any(dim=-1, keepdim=True)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed | empty)
        return out.masked_fill(empty, 0.0)


def _grown(buffer: torch.Tensor, capacity: int, filled: int, dim: int) -> torch.Tensor:
    shape = list(buffer.shape)
    shape[dim] = capacity
    grown = buffer.new_zeros(shape)
    grown.narrow(dim, 0, filled).copy_(buffer.narrow(dim, 0, filled))
    return grown
