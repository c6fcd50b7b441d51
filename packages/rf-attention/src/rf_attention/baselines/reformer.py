"""Reformer (Kitaev et al. 2020): shared-QK attention restricted by locality-sensitive hashing."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rf_attention.baselines._common import (
    GeneratorStateMixin,
    check_int,
    compute_dtype,
    key_validity,
    masked_softmax,
)
from rf_attention.modules import MultiheadSelfAttention
from rf_attention.registry import register
from spectraformer_core import make_generator

#: Logit given to a query's own position: it is attended to only when nothing else is (Kitaev et al.).
SELF_LOGIT = -1e5


class SharedQueryKeyValue(nn.Module):
    """The projection of shared-QK attention: ``x -> [q, q, v]`` from one ``dim -> 2 dim`` linear map.

    Laid out as [`MultiheadSelfAttention`][rf_attention.MultiheadSelfAttention] expects of its ``qkv``.
    """

    def __init__(self, dim: int, *, bias: bool = True) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, 2 * dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., dim)`` -> ``(..., 3 dim)``."""
        q, v = self.linear(x).chunk(2, dim=-1)
        return torch.cat([q, q, v], dim=-1)


@register("reformer")
class ReformerAttention(GeneratorStateMixin, MultiheadSelfAttention):
    """Reformer's shared-QK LSH attention, O(N c n_hashes) for chunks of ``c``.

    Kitaev et al. 2020, "Reformer: The efficient Transformer", ICLR, Section 2.

    Keys are the queries normalized to unit length (shared-QK, Section 2.1). In each of ``n_hashes``
    rounds, positions are hashed by a random rotation, ``h(x) = argmax([x R; -x R])`` with ``R (Dh, nb/2)``
    Gaussian (angular LSH), sorted by (bucket, position) and cut into chunks of ``chunk_length``; each
    chunk attends to itself and the chunk before it (cyclically). A query attends to its own position
    only when no other key is available (logit ``-1e5``, as in the paper's code). The rounds are combined
    by their softmax normalizers, ``sum_r exp(lse_r - logsumexp_r lse_r) o_r`` (Appendix / trax).

    Following the HuggingFace implementation that the Skyformer/LRA benchmark code (and so the
    Spectraformer paper) uses: scores ``q . k / ||k|| / sqrt(Dh)``, keys from other buckets inside the
    attended chunks are not masked, no correction for a key met in several rounds, ``nb`` by default
    the power of two nearest below ``2 N / chunk_length``, rotations drawn afresh on every call (from the
    module's generator). Padded positions get a bucket of their own, sorted last, so the padding changes
    nothing in the chunks of real tokens; they are never attended to.

    The module's projection is `SharedQueryKeyValue` (one map for queries and keys);
    [`attend`][rf_attention.ReformerAttention.attend] uses ``q`` as the keys and ignores ``k``.

    No causal form here: masking later keys inside chunks (as the paper does for language models) still
    lets later tokens decide, through the sorting, which earlier keys share a chunk with a query.

    Args:
        num_features: the budget: chunk length ``num_features // 2`` (each query sees ``num_features``
            keys per round).
        chunk_length: overrides the chunk length.
        n_hashes: hashing rounds.
        n_buckets: buckets per round: 1 or an even number; None for the default above.
        seed: seeds the rotations.
        **kw: [`MultiheadSelfAttention`][rf_attention.MultiheadSelfAttention] arguments (``bias`` also for the
            shared map).
    """

    supports_causal = False

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        num_features: int = 128,
        chunk_length: int | None = None,
        n_hashes: int = 2,
        n_buckets: int | None = None,
        seed: int | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(dim, num_heads, **kw)
        self.qkv = SharedQueryKeyValue(dim, bias=kw.get("bias", True))
        check_int("num_features", num_features, 1)
        self.chunk_length = check_int(
            "chunk_length", max(1, num_features // 2) if chunk_length is None else chunk_length, 1
        )
        self.n_hashes = check_int("n_hashes", n_hashes, 1)
        if n_buckets is not None and (check_int("n_buckets", n_buckets, 1) % 2 and n_buckets != 1):
            raise ValueError(f"n_buckets: expected 1, an even integer or None, got {n_buckets}")
        self.n_buckets = n_buckets
        self.generator = make_generator(seed, None)

    def bucket_count(self, num_chunks: int) -> int:
        """Buckets per round: ``n_buckets``, or the power of two in ``(chunks, 2 chunks]`` (at least 2)."""
        return self.n_buckets or max(2, 2 ** ((2 * num_chunks).bit_length() - 1))

    def buckets(self, q: torch.Tensor, count: int) -> torch.Tensor:
        """Bucket ids ``(B, H, n_hashes, N)`` in ``[0, count)`` of ``q (B, H, N, Dh)`` by random rotations."""
        b, h, n, d = q.shape
        if count == 1:
            return torch.zeros(b, h, self.n_hashes, n, dtype=torch.long, device=q.device)
        rotations = torch.randn(
            d, self.n_hashes, count // 2, generator=self.generator, dtype=torch.float64
        ).to(device=q.device, dtype=q.dtype)
        rotated = torch.einsum("bhnd,drk->bhrnk", q, rotations)
        return torch.cat([rotated, -rotated], dim=-1).argmax(dim=-1)

    def attend(self, q, k, v, key_padding_mask):
        """LSH attention on ``q, v (B, H, N, Dh)`` -> ``(B, H, N, Dh)``; ``k`` is not used (keys = ``q``)."""
        out_dtype, dtype = v.dtype, compute_dtype(v)
        b, h, n, d = q.shape
        valid = key_validity(key_padding_mask, q)
        size = min(self.chunk_length, n)
        num_chunks = -(-n // size)
        length = num_chunks * size
        q, v = (F.pad(x.to(dtype), (0, 0, 0, length - n)) for x in (q, v))
        valid = F.pad(valid, (0, length - n), value=False)
        rounds = self.n_hashes
        with torch.no_grad():
            count = self.bucket_count(num_chunks)
            buckets = self.buckets(q, count).masked_fill(~valid[:, None, None, :], count)
            position = torch.arange(length, device=q.device)
            order = (buckets * length + position).argsort(dim=-1)  # (B, H, R, L)
        gather = order[..., None].expand(-1, -1, -1, -1, d)
        sorted_q = q[:, :, None].expand(-1, -1, rounds, -1, -1).gather(3, gather)
        sorted_v = v[:, :, None].expand(-1, -1, rounds, -1, -1).gather(3, gather)
        sorted_valid = valid[:, None, None, :].expand(-1, h, rounds, -1).gather(3, order)

        def chunks(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(b, h, rounds, num_chunks, size, *x.shape[4:])

        def with_previous(x: torch.Tensor) -> torch.Tensor:
            return torch.cat([x, x.roll(1, dims=3)], dim=4) if num_chunks > 1 else x

        q_c = chunks(sorted_q)
        keys = with_previous(chunks(F.normalize(sorted_q, dim=-1)))
        values = with_previous(chunks(sorted_v))
        pos_q, pos_k = chunks(order), with_previous(chunks(order))
        scores = (q_c @ keys.mT) * d**-0.5  # (B, H, R, chunks, size, context)
        scores = scores.masked_fill(pos_q[..., :, None] == pos_k[..., None, :], SELF_LOGIT)
        weights, lse = masked_softmax(scores, with_previous(chunks(sorted_valid))[..., None, :])
        out = (weights @ values).reshape(b, h, rounds, length, d)
        inverse = order.argsort(dim=-1)
        out = out.gather(3, inverse[..., None].expand(-1, -1, -1, -1, d))
        lse = lse.reshape(b, h, rounds, length).gather(3, inverse).movedim(2, -1)  # (B, H, L, R)
        mix, _ = masked_softmax(lse, torch.isfinite(lse))
        out = torch.einsum("bhlr,bhrld->bhld", mix, out)
        return out[:, :, :n].to(out_dtype)

    def extra_repr(self) -> str:
        """Chunks, rounds and buckets shown by ``repr``."""
        return (
            f"{super().extra_repr()}, chunk_length={self.chunk_length}, n_hashes={self.n_hashes}, "
            f"n_buckets={self.n_buckets}"
        )
