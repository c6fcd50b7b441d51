"""Pieces the baselines share: precision, padding masks, a masked softmax, the iterative pseudo-inverse."""

from __future__ import annotations

import math

import torch

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
    """Moore-Penrose pseudo-inverse of each matrix ``a (..., m, m)`` by the order-7 hyperpower iteration.

    Xiong et al. 2021 (Nystromformer), Eq. 16, after Razavi et al. 2014:
    ``Z_{j+1} = Z_j (13 I - A Z_j (15 I - A Z_j (7 I - A Z_j))) / 4``, started from
    ``Z_0 = A^T / (||A||_1 ||A||_inf)``, which converges to ``A^+`` (also for singular ``A``). The scale is
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


def check_int(name: str, value: object, minimum: int) -> int:
    """``value`` if it is an integer >= ``minimum``, else a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return value


def uniform(shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Uniform ``[0, 1)`` float64 draws made on the generator's device (CPU), moved to ``device``.

    So a seed gives the same draws on every device.
    """
    return torch.rand(shape, generator=generator, dtype=torch.float64, device=generator.device).to(device)


class GeneratorStateMixin:
    """Saves ``self.generator``'s state in the module's ``state_dict`` (as extra state).

    A restored module draws what the saved one would have drawn next, so a resumed run repeats an
    uninterrupted one.
    """

    generator: torch.Generator

    def get_extra_state(self) -> dict:
        """The generator's state."""
        return {"generator_state": self.generator.get_state()}

    def set_extra_state(self, state: dict) -> None:
        """Restore the generator's state saved by `get_extra_state`."""
        self.generator.set_state(state["generator_state"])
