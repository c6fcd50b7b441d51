"""Pieces the baselines share: precision, padding masks, a masked softmax, the iterative pseudo-inverse."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from spectraformer_core import make_generator

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 for float16/bfloat16 inputs (softmax sums, pseudo-inverses), else the input's dtype."""
    return torch.float32 if x.dtype in _LOW_PRECISION else x.dtype


def key_validity(key_padding_mask: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor:
    """Bool ``(B, N)``, True at real tokens, from a ``(B, N)`` padding mask (True = padding) or None."""
    b, n = q.shape[0], q.shape[-2]
    if key_padding_mask is None:
        return torch.ones(b, n, dtype=torch.bool, device=q.device)
    if key_padding_mask.dtype != torch.bool or key_padding_mask.shape != (b, n):
        raise ValueError(
            f"key_padding_mask: expected a bool tensor of shape (B, N) = {(b, n)}, "
            f"got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
        )
    return ~key_padding_mask.to(q.device)


def masked_softmax(scores: torch.Tensor, allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax of ``scores`` over the last axis restricted to ``allowed`` entries, and its log-normalizer.

    A row without any allowed entry gets all-zero weights and log-normalizer ``-inf`` (no NaN, also in
    the gradient).

    Args:
        scores: ``(..., M)`` logits.
        allowed: bool, broadcastable to ``scores``.

    Returns:
        ``(weights (..., M), logsumexp (...))``.
    """
    scores = scores.masked_fill(~allowed, -math.inf)
    top = scores.amax(dim=-1, keepdim=True).detach()
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    e = torch.exp(scores - top)
    total = e.sum(dim=-1, keepdim=True)
    some = total > 0
    total = torch.where(some, total, torch.ones_like(total))
    log_normalizer = (torch.log(total) + top).masked_fill(~some, -math.inf)
    return e / total, log_normalizer.squeeze(-1)


def iterative_pinv(a: torch.Tensor, iterations: int) -> torch.Tensor:
    r"""Moore-Penrose pseudo-inverse of each matrix ``a (..., m, m)`` by the order-7 hyperpower iteration.

    Xiong et al. 2021 (Nystromformer), Eq. 16, after Razavi et al. 2014:
    $Z_{j+1} = \frac{1}{4} Z_j (13 I - A Z_j (15 I - A Z_j (7 I - A Z_j)))$, started from
    $Z_0 = A^\top / (\lVert A \rVert_1 \lVert A \rVert_\infty)$, which converges to $A^+$ (also for singular
    $A$). The scale is
    taken per matrix, as in the paper (the LRA benchmark code takes one maximum over the whole batch).
    """
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    norm_1 = a.abs().sum(dim=-2).amax(dim=-1)
    norm_inf = a.abs().sum(dim=-1).amax(dim=-1)
    z = a.mT / (norm_1 * norm_inf).clamp_min(torch.finfo(a.dtype).tiny)[..., None, None]
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def uniform(shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Uniform ``[0, 1)`` float64 draws made on the generator's device (CPU), moved to ``device``.

    So a seed gives the same draws on every device.
    """
    return torch.rand(shape, generator=generator, dtype=torch.float64, device=generator.device).to(device)


_Module = TypeVar("_Module")
#: ``attend(self, q, k, v, key_padding_mask) -> out`` of an attention module.
_Attend = Callable[[_Module, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def without_autocast(attend: _Attend[_Module]) -> _Attend[_Module]:
    """Run an ``attend(q, k, v, key_padding_mask)`` method with autocast off on ``q``'s device.

    The baselines compute softmax sums, pseudo-inverses and kernel products in float32 for half-precision
    inputs (`compute_dtype`); under ``torch.autocast`` every matmul would be cast back to the low
    precision and mixed-dtype results would meet (as the paper's code does, which disables autocast
    around every attention).
    """

    @functools.wraps(attend)
    def wrapped(
        self: _Module,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        key_padding_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        with torch.autocast(q.device.type, enabled=False):
            return attend(self, q, k, v, key_padding_mask)

    return wrapped


class StepDraws:
    """Random draws made once per training step and repeated, unchanged, in eval mode.

    ``self.generator`` (seeded by the module's ``seed``) gives one *draw seed* per training forward call,
    and that call's draws (landmarks, random blocks, rotations, key samples) come from a generator started
    from it: training stays stochastic, step after step, as in the methods' papers. In eval mode no new
    seed is taken: the draws of the last training step (or of the seed taken at construction) are made
    again, so the output is a deterministic function of the input, as for random-feature attention, whose
    features change only when redrawn in training. The generator's state and the draw seed are saved in
    the ``state_dict`` (extra state), so a restored module evaluates as the saved one and draws, in
    training, what it would have drawn next.
    """

    generator: torch.Generator
    draw_seed: int
    training: bool

    def init_draws(self, seed: int | None) -> None:
        """Seed the generator and take the first draw seed."""
        self.generator = make_generator(seed, None)
        self.draw_seed = self.next_draw_seed()

    def next_draw_seed(self) -> int:
        """A fresh draw seed from the module's generator."""
        return int(torch.randint(0, 2**62, (), generator=self.generator))

    def step_generator(self) -> torch.Generator:
        """The generator of this call's draws: from a new draw seed in training, the current one in eval."""
        if self.training:
            self.draw_seed = self.next_draw_seed()
        return torch.Generator().manual_seed(self.draw_seed)

    def get_extra_state(self) -> dict[str, Any]:
        """The generator's state and the current draw seed."""
        return {"generator_state": self.generator.get_state(), "draw_seed": self.draw_seed}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what `get_extra_state` saved."""
        if not {"generator_state", "draw_seed"} <= state.keys():
            raise ValueError(
                "state_dict: expected extra state with 'generator_state' and 'draw_seed', "
                f"got keys {sorted(state)}"
            )
        self.generator.set_state(state["generator_state"])
        self.draw_seed = int(state["draw_seed"])
