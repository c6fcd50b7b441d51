"""Informer (Zhou et al. 2021): ProbSparse self-attention, full attention for the u most active queries."""

from __future__ import annotations

import math
from typing import Any

import torch

from rf_attention.baselines._common import (
    StepDraws,
    compute_dtype,
    key_validity,
    masked_softmax,
    uniform,
    without_autocast,
)
from rf_attention.modules import MultiheadSelfAttention
from rf_attention.registry import register
from spectraformer_core import check_int

#: Queries per block when the sparsity measurement is computed (bounds its memory).
MEASURE_CHUNK = 1024


@register("informer")
class InformerAttention(StepDraws, MultiheadSelfAttention):
    r"""Informer's ProbSparse self-attention: full attention for the ``u`` most active queries, O(N (u + U)).

    Zhou et al. 2021, "Informer: Beyond efficient Transformer for long sequence time-series forecasting",
    AAAI, Section 3.1.

    Each query $q_i$ gets the sparsity measurement of Eq. 4,
    $M(q_i) = \max_j s_{ij} - \operatorname{mean}_j s_{ij}$ with $s_{ij} = q_i^\top k_j$ over $U$ keys drawn
    uniformly (with replacement) among the real keys; the $u$ queries with the largest $M$ attend with full
    softmax attention (Eq. 3), the others output the mean
    of the values (as the paper and its code do for self-attention without a causal mask).

    The budget follows the code the Spectraformer paper ran (its ``models/attention_informer.py``, from the
    Skyformer repository): ``factor = ceil(s / ln(max_seq_len))`` for ``s = num_features`` and, for a
    sequence of ``N`` tokens, ``u = factor * ceil(ln N)`` active queries and ``U = factor * ceil(ln N)``
    sampled keys per query (the paper's ``c ln L``), each capped at ``N`` (and at least 1): 144 at
    ``s = 128``, ``N = max_seq_len = 4096``. Departures: ``M`` takes the mean over the ``U`` sampled scores
    (the code divides their sum by ``N``), keys are drawn only among real tokens, the lazy queries' mean
    is over real values, padded queries are ranked last (so they never take a slot from a real query),
    wherever the padding is (the code knows no padding). As in the code, one set of draws serves the
    whole batch and every head (mapped onto each sequence's real keys), afresh at every training step and
    kept in eval
    ([`StepDraws`][rf_attention.baselines.StepDraws]). With ``u = N`` every query is active: exact
    softmax attention.

    No causal form: the top-``u`` ranking compares every query with every other, so a position's output
    would depend on later ones.

    Args:
        num_features: the budget ``s``, turned into the code's ``factor`` as above.
        max_seq_len: the longest sequence the model is built for (the code's ``max_seq_len``); only sets
            ``factor``, longer inputs are accepted.
        num_active_queries: a fixed ``u`` instead (capped at ``N``).
        num_sampled_keys: a fixed ``U`` instead (capped at ``N``).
        seed: seeds the key draws and the projections.
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
        num_active_queries: int | None = None,
        num_sampled_keys: int | None = None,
        seed: int | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(dim, num_heads, seed=seed, **kw)
        check_int("num_features", num_features, 1)
        self.max_seq_len = check_int("max_seq_len", max_seq_len, 2)
        self.factor = math.ceil(num_features / math.log(max_seq_len))
        self.num_active_queries = (
            None if num_active_queries is None else check_int("num_active_queries", num_active_queries, 1)
        )
        self.num_sampled_keys = (
            None if num_sampled_keys is None else check_int("num_sampled_keys", num_sampled_keys, 1)
        )
        self.init_draws(seed)

    def log_budget(self, n: int) -> int:
        """``factor * ceil(ln n)``, the paper's ``c ln L``."""
        return self.factor * math.ceil(math.log(n))

    def active_queries(self, n: int) -> int:
        """``u`` for ``n`` tokens: ``num_active_queries`` or ``factor * ceil(ln n)``, within ``[1, n]``."""
        u = self.log_budget(n) if self.num_active_queries is None else self.num_active_queries
        return max(1, min(u, n))

    def sampled_keys(self, n: int) -> int:
        """``U`` for ``n`` tokens: ``num_sampled_keys`` or ``factor * ceil(ln n)``, within ``[1, n]``."""
        count = self.log_budget(n) if self.num_sampled_keys is None else self.num_sampled_keys
        return max(1, min(count, n))

    def sparsity_measurement(
        self, q: torch.Tensor, k: torch.Tensor, valid: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        """``M(q_i)`` of Eq. 4, keys sampled with ``generator``: ``(B, H, N)``; ``-inf`` at padded queries.

        ``q, k (B, H, N, Dh)``, ``valid (B, N)``. Not differentiated (it only selects queries); computed
        ``MEASURE_CHUNK`` queries at a time.
        """
        b, h, n, d = q.shape
        samples = self.sampled_keys(n)
        count = valid.sum(dim=-1)  # (B,)
        real_first = (~valid).to(torch.int8).argsort(dim=-1, stable=True)  # real positions first
        draws = uniform((n, samples), generator, q.device)
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

    @without_autocast
    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """ProbSparse attention on ``q, k, v (B, H, N, Dh)`` -> ``(B, H, N, Dh)``."""
        out_dtype, dtype = v.dtype, compute_dtype(v)
        n, d = q.shape[-2:]
        valid = key_validity(key_padding_mask, q)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        keep = valid[:, None, :, None].to(dtype)
        measure = self.sparsity_measurement(q, k, valid, self.step_generator())
        active = measure.topk(self.active_queries(n), dim=-1).indices
        index = active[..., None].expand(-1, -1, -1, d)  # (B, H, u, Dh)
        scores = (q.gather(2, index) @ k.mT) * d**-0.5
        weights, _ = masked_softmax(scores, valid[:, None, None, :])
        lazy = (v * keep).sum(dim=-2, keepdim=True) / keep.sum(dim=-2, keepdim=True).clamp_min(1.0)
        out = lazy.expand(-1, -1, n, -1).scatter(2, index, weights @ v)
        return out.to(out_dtype)

    def extra_repr(self) -> str:
        """Budget shown by ``repr``."""
        return (
            f"{super().extra_repr()}, factor={self.factor}, max_seq_len={self.max_seq_len}, "
            f"num_active_queries={self.num_active_queries}, num_sampled_keys={self.num_sampled_keys}"
        )
