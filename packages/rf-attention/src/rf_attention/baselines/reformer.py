"""Reformer (Kitaev et al. 2020): shared-QK attention restricted by locality-sensitive hashing."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rf_attention.baselines._common import (
    StepDraws,
    compute_dtype,
    key_validity,
    masked_softmax,
    without_autocast,
)
from rf_attention.modules import MultiheadSelfAttention
from rf_attention.registry import register
from spectraformer_core import check_int

#: Logit given to a query's own position: it is attended to only when nothing else is (Kitaev et al.;
#: HF ``LSHSelfAttention``'s ``self_mask_value_float32``).
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
class ReformerAttention(StepDraws, MultiheadSelfAttention):
    r"""Reformer's shared-QK LSH attention, O(N c n_hashes) for chunks of ``c``.

    Kitaev et al. 2020, "Reformer: The efficient Transformer", ICLR, Section 2.

    Keys are the queries normalized to unit length (shared-QK, Section 2.1) and the logits are
    $q_i \cdot q_j / \lVert q_j\rVert$, with no further scaling (the keys' unit length takes the place of the
    $D_h^{-1/2}$ of dot-product attention, as in HuggingFace's ``LSHSelfAttention``, which the paper's code
    wraps: its keys are RMS-normalized and divided by $\sqrt{D_h}$). In each of ``n_hashes`` rounds,
    positions are hashed by a random rotation, $h(x) = \arg\max([x R; -x R])$ with $R$ ``(Dh, nb/2)``
    Gaussian, one per head and round (angular LSH), and sorted by (bucket, position); the rounds' sorted
    sequences are concatenated and cut into chunks of ``chunk_length``, and each chunk attends to itself
    and the chunk before it (cyclically, so a round's first chunk looks back into the previous round's
    last one). A query attends to its own position only when no other key is available (logit ``-1e5``,
    HF's value). The rounds are combined by their softmax normalizers,
    $\sum_r \exp(\mathrm{lse}_r - \operatorname{logsumexp}_r \mathrm{lse}_r)\, o_r$.

    Also as in HF: keys from other buckets inside the attended chunks are not masked, no correction for a
    key met in several rounds, ``nb`` by default the power of two in $(N / c, 2 N / c]$ for $N$ padded
    to a multiple of $c$, plain exact attention (no hashing) when $N \le c$, padded positions in a bucket
    of their own, sorted last, and never attended to. Departures: one rotation of ``nb / 2`` columns also
    for large ``nb`` (HF factorizes ``nb`` into two rotations above $2 \max(\sqrt{N / c}, c)$ buckets, for
    $N$ beyond about $c^2$), keys normalized by $\max(\lVert q\rVert, 10^{-12})$ (HF:
    $\sqrt{\lVert q\rVert^2 + 10^{-6} D_h}$),
    and the rotations drawn afresh at every training step and kept in eval
    ([`StepDraws`][rf_attention.baselines.StepDraws]; HF draws at every call).

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
        seed: seeds the rotations and the projections.
        **kw: [`MultiheadSelfAttention`][rf_attention.MultiheadSelfAttention] arguments (``bias`` also for
            the shared map).
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
        check_int("num_features", num_features, 1)
        self.chunk_length = check_int(
            "chunk_length", max(1, num_features // 2) if chunk_length is None else chunk_length, 1
        )
        self.n_hashes = check_int("n_hashes", n_hashes, 1)
        if n_buckets is not None and (check_int("n_buckets", n_buckets, 1) % 2 and n_buckets != 1):
            raise ValueError(f"n_buckets: expected 1, an even integer or None, got {n_buckets}")
        self.n_buckets = n_buckets
        self.qkv = SharedQueryKeyValue(dim, bias=kw.get("bias", True))
        if seed is not None:
            self.reset_projections(seed)  # after replacing qkv: the shared map is seeded too
        self.init_draws(seed)

    def bucket_count(self, num_chunks: int) -> int:
        """Buckets per round: ``n_buckets``, or the power of two in ``(chunks, 2 chunks]`` (at least 2)."""
        return self.n_buckets or max(2, 2 ** ((2 * num_chunks).bit_length() - 1))

    def buckets(self, q: torch.Tensor, count: int, generator: torch.Generator) -> torch.Tensor:
        """Bucket ids ``(B, H, n_hashes, N)`` in ``[0, count)`` of ``q (B, H, N, Dh)``.

        Angular LSH with Gaussian rotations ``(H, Dh, n_hashes, count / 2)`` drawn from ``generator``.
        """
        b, h, n, d = q.shape
        if count == 1:
            return torch.zeros(b, h, self.n_hashes, n, dtype=torch.long, device=q.device)
        rotations = torch.randn(
            h, d, self.n_hashes, count // 2, generator=generator, dtype=torch.float64, device=generator.device
        ).to(device=q.device, dtype=q.dtype)
        rotated = torch.einsum("bhnd,hdrk->bhrnk", q, rotations)
        return torch.cat([rotated, -rotated], dim=-1).argmax(dim=-1)

    def sorted_chunk_attention(
        self, q: torch.Tensor, v: torch.Tensor, buckets: torch.Tensor, valid: torch.Tensor, size: int
    ) -> torch.Tensor:
        r"""Shared-QK attention within chunks of the positions sorted by bucket, rounds combined.

        Args:
            q: ``(B, H, L, Dh)`` queries (the keys are $q / \lVert q\rVert$), ``L`` a multiple of ``size``.
            v: ``(B, H, L, Dv)``.
            buckets: ``(B, H, R, L)`` bucket ids, one row per round.
            valid: bool ``(B, L)``, False at padding (never attended to).
            size: the chunk length.

        Returns:
            ``(B, H, L, Dv)``.
        """
        b, h, rounds, length = buckets.shape
        dv = v.shape[-1]
        num_chunks = rounds * length // size  # chunks of all rounds, in one sequence
        with torch.no_grad():
            position = torch.arange(length, device=q.device)
            order = (buckets * length + position).argsort(dim=-1)  # (B, H, R, L)

        def in_order(x: torch.Tensor) -> torch.Tensor:  # (B, H, L, D) -> (B, H, R, L, D), each round sorted
            index = order[..., None].expand(-1, -1, -1, -1, x.shape[-1])
            return x[:, :, None].expand(-1, -1, rounds, -1, -1).gather(3, index)

        sorted_q, sorted_v = in_order(q), in_order(v)
        sorted_valid = valid[:, None, None, :].expand(-1, h, rounds, -1).gather(3, order)

        def chunks(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(b, h, num_chunks, size, *x.shape[4:])

        def with_previous(x: torch.Tensor) -> torch.Tensor:
            return torch.cat([x, x.roll(1, dims=2)], dim=3) if num_chunks > 1 else x

        keys = with_previous(chunks(F.normalize(sorted_q, dim=-1)))
        pos_q, pos_k = chunks(order), with_previous(chunks(order))
        scores = chunks(sorted_q) @ keys.mT  # (B, H, chunks, size, context)
        scores = scores.masked_fill(pos_q[..., :, None] == pos_k[..., None, :], SELF_LOGIT)
        weights, lse = masked_softmax(scores, with_previous(chunks(sorted_valid))[..., None, :])
        out = (weights @ with_previous(chunks(sorted_v))).reshape(b, h, rounds, length, dv)
        inverse = order.argsort(dim=-1)
        out = out.gather(3, inverse[..., None].expand(-1, -1, -1, -1, dv))
        lse = lse.reshape(b, h, rounds, length).gather(3, inverse).movedim(2, -1)  # (B, H, L, R)
        mix, _ = masked_softmax(lse, torch.isfinite(lse))
        return torch.einsum("bhlr,bhrld->bhld", mix, out)

    @without_autocast
    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """LSH attention on ``q, v (B, H, N, Dh)`` -> ``(B, H, N, Dh)``; ``k`` is not used (keys = ``q``)."""
        out_dtype, dtype = v.dtype, compute_dtype(v)
        b, h, n, _ = q.shape
        valid = key_validity(key_padding_mask, q)
        size = min(self.chunk_length, n)
        num_chunks = -(-n // size)
        length = num_chunks * size
        q, v = (F.pad(x.to(dtype), (0, 0, 0, length - n)) for x in (q, v))
        valid = F.pad(valid, (0, length - n), value=False)
        generator = self.step_generator()  # drawn from in training even when N <= c: one seed per step
        if num_chunks == 1:  # the whole sequence in one chunk: exact attention, one round, no hashing
            buckets = torch.zeros(b, h, 1, length, dtype=torch.long, device=q.device)
        else:
            with torch.no_grad():
                count = self.bucket_count(num_chunks)
                buckets = self.buckets(q, count, generator).masked_fill(~valid[:, None, None, :], count)
        return self.sorted_chunk_attention(q, v, buckets, valid, size)[:, :, :n].to(out_dtype)

    def extra_repr(self) -> str:
        """Chunks, rounds and buckets shown by ``repr``."""
        return (
            f"{super().extra_repr()}, chunk_length={self.chunk_length}, n_hashes={self.n_hashes}, "
            f"n_buckets={self.n_buckets}"
        )
