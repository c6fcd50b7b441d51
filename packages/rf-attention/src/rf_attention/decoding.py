r"""Token-by-token decoding: the recurrent state of causal RF attention and the KV cache of softmax attention.

Causal kernelized attention (Eq. 7 with the sums over $j \le i$) is a recurrence: after $t$ tokens,
everything later queries need is the ``m x Dv`` numerator state $\sum_j \phi_{k_j}^\top v_j$, the normalizer
$\sum_j \phi_{k_j}$ and the running stabilizer, whatever $t$ is ($O(1)$ memory and time per token). The
stabilization is the one of [`rf_attention`][rf_attention.rf_attention] in causal mode: key $j$'s
features are $\phi_{k_j} e^{c_j}$ with $c_j$ its largest log-feature
(``FeatureMap.forward_with_key_scales``), and the sums are kept relative to the running maximum
$M = \max_{j \le t} c_j$, rescaled by $e^{M_\mathrm{old} - M_\mathrm{new}} \le 1$ when it grows. Exact softmax
attention has no such state: it keeps every key and value ([`KVCache`][rf_attention.decoding.KVCache],
O(t) per token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rf_attention.functional import _accumulation_dtype, linear_attention
from rf_attention.ops.causal import causal_block, weighted_key_sums
from rf_attention.ops.common import finite_or_zero, with_ones

#: New tokens per block when ``recurrent_attention`` is given many at once.
DEFAULT_BLOCK_SIZE = 128


@dataclass
class RecurrentState:
    """Sums over the keys seen so far, relative to the running stabilizer $M$ (recurrent Eq. 7).

    Attributes:
        numerator: ``(..., m, Dv)``: ``sum_j exp(c_j - M) phi_k_j^T v_j``.
        normalizer: ``(..., m)``: ``sum_j exp(c_j - M) phi_k_j``.
        magnitude: ``(..., m)``: ``sum_j exp(c_j - M) |phi_k_j|``, the scale of the normalizer's guard.
        reference: ``(...)``: ``M = max_j c_j``, ``-inf`` while no (non-padding) key has been seen.
        length: tokens seen, padding included (the position of the next token): an ``int``, or a
            ``(B,)`` integer tensor when the ``B`` sequences have different lengths (a packed prefill,
            ``prefill(..., cu_seqlens=...)``); each new token adds 1 to every entry.
    """

    numerator: torch.Tensor
    normalizer: torch.Tensor
    magnitude: torch.Tensor
    reference: torch.Tensor
    length: int | torch.Tensor = 0

    @classmethod
    def empty(
        cls,
        lead: tuple[int, ...],
        num_features: int,
        value_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> RecurrentState:
        """The state before any token, for leading shape ``lead`` (``(B, H)``)."""
        zeros = torch.zeros(*lead, num_features, dtype=dtype, device=device)
        return cls(
            numerator=torch.zeros(*lead, num_features, value_dim, dtype=dtype, device=device),
            normalizer=zeros,
            magnitude=zeros.clone(),
            reference=torch.full(lead, -math.inf, dtype=dtype, device=device),
        )

    def nbytes(self) -> int:
        """Bytes held by the state (independent of ``length``)."""
        return sum(t.numel() * t.element_size() for t in self._tensors())

    def check_fits(self, lead: tuple[int, ...], num_features: int, value_dim: int) -> None:
        """A ``ValueError`` unless the state belongs to inputs of leading shape ``lead`` and these widths."""
        expected = (*lead, num_features, value_dim)
        if tuple(self.numerator.shape) != expected:
            raise ValueError(
                f"state: expected a RecurrentState of numerator shape {expected} (batch, heads, features, "
                f"value dim), got {tuple(self.numerator.shape)}"
            )

    def select(self, index: torch.Tensor) -> RecurrentState:
        """The state of batch rows ``index`` (``(B',)`` integers; beam search reorders with it)."""
        index = index.to(self.numerator.device)
        length = self.length[index] if isinstance(self.length, torch.Tensor) else self.length
        return RecurrentState(
            numerator=self.numerator.index_select(0, index),
            normalizer=self.normalizer.index_select(0, index),
            magnitude=self.magnitude.index_select(0, index),
            reference=self.reference.index_select(0, index),
            length=length,
        )

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return self.numerator, self.normalizer, self.magnitude, self.reference


def _packed(state: RecurrentState) -> torch.Tensor:
    """``[numerator, normalizer]`` ``(..., m, Dv + 1)``, the kernels' layout of the sums."""
    return torch.cat((state.numerator, state.normalizer.unsqueeze(-1)), dim=-1)


def _unpacked(
    sums: torch.Tensor, magnitude: torch.Tensor, reference: torch.Tensor, length: int | torch.Tensor
) -> RecurrentState:
    return RecurrentState(
        numerator=sums[..., :-1],
        normalizer=sums[..., -1],
        magnitude=magnitude,
        reference=reference,
        length=length,
    )


def accumulate_keys(
    state: RecurrentState, phi_k: torch.Tensor, key_log_scale: torch.Tensor, v: torch.Tensor
) -> RecurrentState:
    """The state after keys ``phi_k (..., T, m)`` with log-scales ``(..., T)`` and values ``v (..., T, Dv)``.

    Padded keys have zero features and log-scale ``-inf``; they change nothing but ``length``. The sums are
    those of the causal kernel (`rf_attention.ops.causal.weighted_key_sums`), relative
    to ``M = max(M_old, max_j c_j)``, the old ones rescaled by ``exp(M_old - M) <= 1``.
    """
    reference = torch.maximum(state.reference, key_log_scale.amax(dim=-1))
    safe = finite_or_zero(reference)
    decay = torch.exp(state.reference - safe)  # 0 for an empty state (reference -inf)
    sums, magnitude = weighted_key_sums(phi_k, key_log_scale, with_ones(v), safe)
    return _unpacked(
        _packed(state) * decay[..., None, None] + sums,
        state.magnitude * decay.unsqueeze(-1) + magnitude,
        reference,
        state.length + phi_k.shape[-2],
    )


def recurrent_attention(
    state: RecurrentState,
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    key_log_scale: torch.Tensor,
    v: torch.Tensor,
    *,
    eps: float | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> tuple[torch.Tensor, RecurrentState]:
    r"""Causal linear attention of $T$ new tokens that continue ``state`` (recurrent Eq. 7).

    Position $i$ of the new tokens attends to every key in ``state`` and to the new keys $j \le i$,
    exactly as in the causal forward pass over the whole sequence: the same chunk-parallel computation
    (`rf_attention.ops.causal.causal_block`, all blocks of ``block_size`` tokens at once),
    stabilization and normalizer guard. $T = 1$ is one decoding step, $O(m D_v)$ whatever the context.

    Args:
        state: the keys so far
            ([`RecurrentState.empty`][rf_attention.decoding.RecurrentState.empty] for none).
        phi_q: ``(..., T, m)`` query features, each row stabilized by its own constant.
        phi_k: ``(..., T, m)`` key features divided by ``exp(key_log_scale)``; zero rows at padding.
        key_log_scale: ``(..., T)``, ``-inf`` at padding (``FeatureMap.forward_with_key_scales``).
        v: ``(..., T, Dv)``.
        eps: relative guard of the normalizer, as in [`linear_attention`][rf_attention.linear_attention]
            ($|D| \le \varepsilon\, |\phi_q| \cdot \sum_j |\phi_{k_j}|$ becomes $\operatorname{sign}(D)$ times
            that bound; for positive features only $D = 0$, a row without keys, changes); default: the state
            dtype's epsilon.
        block_size: new tokens per chunk (``block x block`` products).

    Returns:
        ``(out (..., T, Dv) in the state's dtype, the state after the T tokens)``.
    """
    acc = state.numerator.dtype
    eps = torch.finfo(acc).eps if eps is None else eps
    phi_q, phi_k, key_log_scale, v = phi_q.to(acc), phi_k.to(acc), key_log_scale.to(acc), v.to(acc)
    out, sums, magnitude, reference = causal_block(
        phi_q,
        phi_k,
        key_log_scale,
        v,
        _packed(state),
        state.magnitude,
        state.reference,
        chunk=block_size,
        eps=eps,
        signed=True,
    )
    assert magnitude is not None, "a given magnitude is carried"
    return out, _unpacked(sums, magnitude, reference, state.length + phi_q.shape[-2])


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


def causal_prefill(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    key_log_scale: torch.Tensor,
    v: torch.Tensor,
    *,
    key_padding_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, RecurrentState]:
    """Causal linear attention of a whole prefix and the recurrent state it leaves (Eq. 7).

    The state continues with [`recurrent_attention`][rf_attention.decoding.recurrent_attention].

    Args:
        phi_q: ``(B, H, N, m)`` query features (``FeatureMap.forward_with_key_scales``).
        phi_k: ``(B, H, N, m)`` key features divided by ``exp(key_log_scale)``.
        key_log_scale: ``(B, H, N)``, ``-inf`` at padding.
        v: ``(B, H, N, Dv)``.
        key_padding_mask: bool ``(B, N)``, True at padding (never attended to, now or later).

    Returns:
        ``(out (B, H, N, Dv) in v's dtype, state)`` with the state in the accumulation dtype
        (float32 for float16/bfloat16 inputs).
    """
    out = linear_attention(
        phi_q, phi_k, v, causal=True, key_padding_mask=key_padding_mask, key_log_scale=key_log_scale
    )
    acc = _accumulation_dtype(phi_q, phi_k, v)
    lead = tuple(phi_k.shape[:-2])
    state = RecurrentState.empty(lead, phi_k.shape[-1], v.shape[-1], dtype=acc, device=phi_k.device)
    return out, accumulate_keys(state, phi_k.to(acc), key_log_scale.to(acc), v.to(acc))
