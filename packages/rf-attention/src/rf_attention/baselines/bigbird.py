"""BigBird (Zaheer et al. 2020): block-sparse attention with window, global and random blocks."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

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


@register("bigbird")
class BigBirdAttention(StepDraws, MultiheadSelfAttention):
    """BigBird block-sparse attention (window, global and random blocks), O(N (w + g + r) b).

    Zaheer et al. 2020, "Big Bird: Transformers for longer sequences", NeurIPS; the ITC variant, computed
    block by block, so time and memory are O(N (w + g + r) b) for blocks of ``b`` tokens.

    The sequence is cut into blocks of ``b`` tokens (padded at the end to a multiple of ``b``). Each query
    block attends to the key blocks of (Section 2 and Appendix D):

    - its window: ``window_blocks`` (odd) blocks centred on itself, not wrapping around the ends;
    - the global blocks: the first ``ceil(g / 2)`` and last ``floor(g / 2)`` blocks; the queries of a global
      block attend to every key;
    - ``random_blocks`` blocks drawn per head and query block, uniformly among those not already
      attended (fewer when not enough remain), afresh at every training step and kept in eval
      ([`StepDraws`][rf_attention.baselines.StepDraws]).

    A key block reached twice (window and global) counts once, so with a window covering the sequence
    this is exact softmax attention. Padded keys are masked everywhere; a query without real keys gets 0.
    At ``num_features = 128`` the defaults are the Skyformer/LRA benchmark configuration (block 64,
    3 random blocks); window 3 and 2 global blocks (first and last) are the BigBird-ITC layout of the
    benchmark's and HuggingFace's code.

    No causal form here (global query blocks see the whole sequence).

    Args:
        num_features: the budget: the block size is ``num_features // 2`` (each query sees
            ``(window + global + random) * num_features / 2`` keys).
        block_size: overrides the block size.
        window_blocks: odd number of blocks in the sliding window.
        global_blocks: number of global blocks (0 for none).
        random_blocks: random blocks per query block.
        seed: seeds the random blocks and the projections.
        **kw: [`MultiheadSelfAttention`][rf_attention.MultiheadSelfAttention] arguments.
    """

    supports_causal = False

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        num_features: int = 128,
        block_size: int | None = None,
        window_blocks: int = 3,
        global_blocks: int = 2,
        random_blocks: int = 3,
        seed: int | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(dim, num_heads, seed=seed, **kw)
        check_int("num_features", num_features, 1)
        self.block_size = check_int(
            "block_size", max(1, num_features // 2) if block_size is None else block_size, 1
        )
        if check_int("window_blocks", window_blocks, 1) % 2 == 0:
            raise ValueError(f"window_blocks: expected an odd integer >= 1, got {window_blocks}")
        self.window_blocks = window_blocks
        self.global_blocks = check_int("global_blocks", global_blocks, 0)
        self.random_blocks = check_int("random_blocks", random_blocks, 0)
        self.init_draws(seed)

    def global_block_indices(self, num_blocks: int, device: torch.device) -> torch.Tensor:
        """The global blocks: the first ``ceil(g / 2)`` and the last ``floor(g / 2)``, sorted, no repeats."""
        first = range(min((self.global_blocks + 1) // 2, num_blocks))
        last = range(max(num_blocks - self.global_blocks // 2, 0), num_blocks)
        return torch.tensor(sorted({*first, *last}), dtype=torch.long, device=device)

    def key_blocks(
        self, num_blocks: int, device: torch.device, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Key block indices ``(H, nb, c)`` each query block attends to, and which of them count.

        ``c = window + global + random`` slots; a slot does not count when its window block lies outside
        the sequence, its global block is already in the window, or no random block was left to draw.
        """
        h, nb = self.num_heads, num_blocks
        rows = torch.arange(nb, device=device)
        half = self.window_blocks // 2
        window = rows[:, None] + torch.arange(-half, half + 1, device=device)  # (nb, w)
        window_ok = (window >= 0) & (window < nb)
        glob = self.global_block_indices(nb, device)
        glob_slots = glob.expand(nb, -1)
        glob_ok = (glob_slots - rows[:, None]).abs() > half
        # Random blocks: the smallest of uniform draws over the blocks not yet attended.
        taken = (rows[None, :] - rows[:, None]).abs() <= half
        taken[:, glob] = True
        count = min(self.random_blocks, nb)
        draws = uniform((h, nb, nb), generator, device).masked_fill(taken, torch.inf)
        picked = draws.topk(count, dim=-1, largest=False)
        index = torch.cat(
            [window.clamp(0, nb - 1).expand(h, -1, -1), glob_slots.expand(h, -1, -1), picked.indices], dim=-1
        )
        ok = torch.cat(
            [window_ok.expand(h, -1, -1), glob_ok.expand(h, -1, -1), torch.isfinite(picked.values)], dim=-1
        )
        return index, ok

    @without_autocast
    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Block-sparse attention on ``q, k, v (B, H, N, Dh)`` -> ``(B, H, N, Dh)``."""
        out_dtype, dtype = v.dtype, compute_dtype(v)
        b, h, n, d = q.shape
        valid = key_validity(key_padding_mask, q)
        size = self.block_size
        nb = -(-n // size)
        pad = nb * size - n
        q, k, v = (F.pad(x.to(dtype), (0, 0, 0, pad)) for x in (q, k, v))
        valid = F.pad(valid, (0, pad), value=False)
        scale = d**-0.5
        index, ok = self.key_blocks(nb, q.device, self.step_generator())  # (H, nb, c)
        heads = torch.arange(h, device=q.device)[:, None, None]
        k_sel = k.view(b, h, nb, size, d)[:, heads, index].flatten(3, 4)  # (B, H, nb, c*size, d)
        v_sel = v.view(b, h, nb, size, d)[:, heads, index].flatten(3, 4)
        allowed = (valid.view(b, nb, size)[:, index] & ok[..., None]).flatten(3, 4)  # (B, H, nb, c*size)
        q_blocks = q.view(b, h, nb, size, d)
        weights, _ = masked_softmax((q_blocks @ k_sel.mT) * scale, allowed.unsqueeze(-2))
        out = weights @ v_sel  # (B, H, nb, size, d)
        glob = self.global_block_indices(nb, q.device)
        if glob.numel():
            q_glob = q_blocks[:, :, glob].flatten(2, 3)  # (B, H, g*size, d)
            weights, _ = masked_softmax((q_glob @ k.mT) * scale, valid[:, None, None, :])
            out = out.index_copy(2, glob, (weights @ v).view(b, h, glob.numel(), size, d))
        return out.view(b, h, nb * size, d)[:, :, :n].to(out_dtype)

    def extra_repr(self) -> str:
        """Block layout shown by ``repr``."""
        return (
            f"{super().extra_repr()}, block_size={self.block_size}, window_blocks={self.window_blocks}, "
            f"global_blocks={self.global_blocks}, random_blocks={self.random_blocks}"
        )
