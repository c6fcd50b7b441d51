"""Informer (Zhou et al. 2021): ProbSparse self-attention, full attention for the u most active queries."""

from __future__ import annotations

from typing import Any

import torch

from rf_attention.baselines._common import (
    GeneratorStateMixin,
    check_int,
    compute_dtype,
    key_validity,
    masked_softmax,
    uniform,
)
from rf_attention.modules import MultiheadSelfAttention
from rf_attention.registry import register
from spectraformer_core import make_generator

#: Queries per block when the sparsity measurement is computed (bounds its memory).
MEASURE_CHUNK = 1024


@register("informer")
class InformerAttention(GeneratorStateMixin, MultiheadSelfAttention):
    """Informer's ProbSparse self-attention: full attention for the ``u`` most active queries, O(N (u + U)).

    Zhou et al. 2021, "Informer: Beyond efficient Transformer for long sequence time-series forecasting",
    AAAI, Section 3.1.

    Each query ``q_i`` gets the sparsity measurement of Eq. 4, ``M(q_i) = max_j s_ij - mean_j s_ij`` with
    ``s_ij = q_i . k_j`` over ``U`` keys drawn uniformly (with replacement) among the real keys; the ``u``
    queries with the largest ``M`` attend with full softmax attention (Eq. 3), the others output the mean
    of the values (as the paper and its code do for self-attention without a causal mask).

    Following the Skyformer/LRA benchmark code: ``u = U = num_features`` (the code's ``factor``), capped
    at ``N``; key draws only among real tokens. Departures: ``M`` takes the mean over the ``U`` sampled
    scores (the code divides their sum by ``N``), padded queries are ranked last (so they never take a
    slot from a real query), the real keys are found wherever the padding is (the code assumes padding
    at the end), and the draws come from the module's generator (afresh on every call; one set of draws
    per batch element, shared by the heads). With ``u = N`` every query is active: exact softmax attention.

    No causal form: the top-``u`` ranking compares every query with every other, so a position's output
    would depend on later ones.

    Args:
        num_features: the budget: ``u`` active queries and ``U`` sampled keys per query.
        num_active_queries: overrides ``u``.
        num_sampled_keys: overrides ``U``.
        seed: seeds the key draws.
        **kw: [`MultiheadSelfAttention`][rf_attention.MultiheadSelfAttention] arguments.
    """

    supports_causal = False

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        num_features: int = 128,
        num_active_queries: int | None = None,
        num_sampled_keys: int | None = None,
        seed: int | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(dim, num_heads, **kw)
        check_int("num_features", num_features, 1)
        self.num_active_queries = check_int(
            "num_active_queries", num_features if num_active_queries is None else num_active_queries, 1
        )
        self.num_sampled_keys = check_int(
            "num_sampled_keys", num_features if num_sampled_keys is None else num_sampled_keys, 1
        )
        self.generator = make_generator(seed, None)

    def sparsity_measurement(self, q: torch.Tensor, k: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """``M(q_i)`` of Eq. 4 from sampled keys: ``(B, H, N)``; ``-inf`` at padded queries.

        ``q, k (B, H, N, Dh)``, ``valid (B, N)``. Not differentiated (it only selects queries); computed
        ``MEASURE_CHUNK`` queries at a time.
        """
        b, h, n, d = q.shape
        samples = min(self.num_sampled_keys, n)
        count = valid.sum(dim=-1)  # (B,)
        real_first = (~valid).to(torch.int8).argsort(dim=-1, stable=True)  # real positions first
        draws = uniform((n, samples), self.generator, q.device)
        slot = (draws[None] * count[:, None, None]).long().clamp_max(n - 1)  # (B, N, U) in [0, count)
        picked = real_first.gather(1, slot.flatten(1)).view(b, n, samples)
        parts = []
        with torch.no_grad():
            for start in range(0, n, MEASURE_CHUNK):
                stop = min(start + MEASURE_CHUNK, n)
                index = picked[:, None, start:stop].flatten(2)  # (B, 1, chunk*U)
                keys = k.gather(2, index[..., None].expand(-1, h, -1, d)).view(b, h, stop - start, samples, d)
                scores = (keys @ q[:, :, start:stop, :, None]).squeeze(-1)  # (B, H, chunk, U)
                parts.append(scores.amax(dim=-1) - scores.mean(dim=-1))
        return torch.cat(parts, dim=-1).masked_fill(~valid[:, None, :], -torch.inf)

    def attend(self, q, k, v, key_padding_mask):
        """ProbSparse attention on ``q, k, v (B, H, N, Dh)`` -> ``(B, H, N, Dh)``."""
        out_dtype, dtype = v.dtype, compute_dtype(v)
        n, d = q.shape[-2:]
        valid = key_validity(key_padding_mask, q)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        keep = valid[:, None, :, None].to(dtype)
        active = self.sparsity_measurement(q, k, valid).topk(min(self.num_active_queries, n), dim=-1).indices
        index = active[..., None].expand(-1, -1, -1, d)  # (B, H, u, Dh)
        scores = (q.gather(2, index) @ k.mT) * d**-0.5
        weights, _ = masked_softmax(scores, valid[:, None, None, :])
        lazy = (v * keep).sum(dim=-2, keepdim=True) / keep.sum(dim=-2, keepdim=True).clamp_min(1.0)
        out = lazy.expand(-1, -1, n, -1).scatter(2, index, weights @ v)
        return out.to(out_dtype)

    def extra_repr(self) -> str:
        """Active queries and sampled keys shown by ``repr``."""
        return (
            f"{super().extra_repr()}, num_active_queries={self.num_active_queries}, "
            f"num_sampled_keys={self.num_sampled_keys}"
        )
