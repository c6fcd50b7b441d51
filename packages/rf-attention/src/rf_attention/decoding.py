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

[`decode_heads`][rf_attention.decoding.decode_heads] is the one decoding entry of random-feature attention:
the modules' ``prefill`` and ``step`` and the Hugging Face cache
([`RecurrentCacheLayer`][rf_attention.hf.RecurrentCacheLayer], which holds the same state objects) call it,
and [`attend_after_cached_keys`][rf_attention.decoding.attend_after_cached_keys] builds on it for a cache of
keys. ``scale`` is the logit scale of ``q . k`` everywhere (``sqrt(scale)`` on each of ``q`` and ``k``
before the features; [`input_scale`][rf_attention.functional.input_scale]).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F

import rf_features
from rf_attention.ops.recurrent import RecurrentState, decode, decode_window
from rf_attention.ops.triton import check_backend
from rf_attention.ops.window import WindowState

__all__ = [
    "KVCache",
    "RecurrentState",
    "WindowState",
    "attend_after_cached_keys",
    "decode",
    "decode_heads",
    "decode_window",
]

#: The decoding state of random-feature attention: the feature sums, or with a window also its ring.
DecodingState = RecurrentState | WindowState


def decode_heads(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    feature_map: rf_features.FeatureMap,
    state: DecodingState | None,
    *,
    window: int = 0,
    key_padding_mask: torch.Tensor | None = None,
    scale: float | None = None,
    ends: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, DecodingState]:
    """Causal RF attention of ``T`` new positions ``(B, H, T, Dh)`` continuing ``state``, and the state after.

    [`decode`][rf_attention.ops.recurrent.decode] (``window=0``) or
    [`decode_window`][rf_attention.ops.recurrent.decode_window]: from ``state=None`` a prefill (the causal
    forward pass and the state it leaves), from a state a step. ``scale`` is the logit scale of ``q . k``
    (default ``Dh ** -0.5``); ``ends`` ``(B,)`` ends right-padded packed prompts (window only: the plain
    state skips padding by itself). ``backend``: ``decode``'s (a step of the plain state is one Triton
    launch on ``"triton"``, and on ``"auto"`` for CUDA tensors); the window's state decodes on PyTorch
    (``"triton"`` is refused).

    Returns:
        ``(out (B, H, T, Dv), state)``.

    Raises:
        ValueError: a state of the other kind (a window's for a plain attention, or the reverse).
    """
    check_backend(backend)
    if window:
        if backend == "triton":
            raise ValueError(
                f"backend: the Triton kernels have no sliding window; decode window={window} with "
                "backend='auto' or 'torch'"
            )
        held = cast(WindowState | None, state)  # decode_window refuses a state of another kind by name
        return decode_window(
            q,
            k,
            v,
            feature_map,
            held,
            window=window,
            key_padding_mask=key_padding_mask,
            scale=scale,
            ends=ends,
        )
    if state is not None and not isinstance(state, RecurrentState):
        raise ValueError(
            f"state: expected a RecurrentState (from prefill or step) or None, got {type(state).__name__}"
        )
    return decode(
        q, k, v, feature_map, state, key_padding_mask=key_padding_mask, scale=scale, backend=backend
    )


def attend_after_cached_keys(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    feature_map: rf_features.FeatureMap,
    *,
    window: int = 0,
    key_padding_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Causal RF attention of the last ``N_q`` positions when the first ``N_k - N_q`` keys come from a cache.

    ``q (B, H, N_q, Dh)``, ``k, v (B, H, N_k, D)``, ``key_padding_mask (B, N_k)``: the cached keys build a
    state (`decode_heads` from none; the keys stand in for their queries, whose outputs are dropped), which
    the new positions continue: O(N_k) per call, for a cache that keeps keys (HF's ``DynamicCache``).

    Returns:
        ``(B, H, N_q, Dv)``.
    """
    prefix = k.shape[-2] - q.shape[-2]
    before = None if key_padding_mask is None else key_padding_mask[:, :prefix]
    after = None if key_padding_mask is None else key_padding_mask[:, prefix:]
    cached_k, cached_v = k[..., :prefix, :], v[..., :prefix, :]
    _, state = decode_heads(
        cached_k, cached_k, cached_v, feature_map, None, window=window, key_padding_mask=before, scale=scale
    )
    new_k, new_v = k[..., prefix:, :], v[..., prefix:, :]
    out, _ = decode_heads(
        q, new_k, new_v, feature_map, state, window=window, key_padding_mask=after, scale=scale
    )
    return out


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
