"""Learning-rate schedules in steps, and the AdamW parameter groups with the apps' one no-decay rule.

A schedule is a factor of step ``t`` (0-based: the step about to be taken) that multiplies each parameter
group's peak learning rate; [`Trainer`][app_common.harness.Trainer] sets ``lr = peak * factor(t)`` before
step ``t``. Warm-up is linear from ``1 / warmup_steps`` to 1 over ``warmup_steps`` steps; the decay then runs
from the
peak to ``final`` (a fraction of the peak) at step ``steps``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from spectraformer_core import Registry, check_int

#: A learning-rate factor of the 0-based step.
Schedule = Callable[[int], float]

SCHEDULES: Registry[Callable[..., Schedule]] = Registry("schedule")

#: Parameter names (last dotted part) that get no weight decay whatever their shape: coefficients, not
#: weights (RaLiMP's per-node channel weights), and the embeddings of positions and the class token.
NO_DECAY_NAMES = ("node_cos", "node_sin", "poly_coef", "pos_embed", "cls_token")


def _after_warmup(warmup_steps: int, decay: Schedule) -> Schedule:
    """Linear warm-up over ``warmup_steps`` steps, then ``decay(step)``."""

    def factor(step: int) -> float:
        return (step + 1) / warmup_steps if step < warmup_steps else decay(step)

    return factor


@SCHEDULES.register("constant")
def constant(warmup_steps: int = 0, steps: int = 1, *, final: float = 1.0) -> Schedule:
    """Linear warm-up, then the peak for good (``steps`` and ``final`` are ignored)."""
    check_int("warmup_steps", warmup_steps, minimum=0)
    return _after_warmup(warmup_steps, lambda step: 1.0)


@SCHEDULES.register("linear")
def linear(warmup_steps: int, steps: int, *, final: float = 0.0) -> Schedule:
    """Linear warm-up, then linear decay from the peak to ``final`` at ``steps`` (and ``final`` after)."""
    check_int("warmup_steps", warmup_steps, minimum=0)
    check_int("steps", steps, minimum=1)
    span = max(1, steps - warmup_steps)
    return _after_warmup(warmup_steps, lambda step: final + (1 - final) * max(0.0, (steps - step) / span))


@SCHEDULES.register("cosine")
def cosine(warmup_steps: int, steps: int, *, final: float = 0.0) -> Schedule:
    """Linear warm-up, then half a cosine from the peak to ``final`` at ``steps`` (and ``final`` after)."""
    check_int("warmup_steps", warmup_steps, minimum=0)
    check_int("steps", steps, minimum=1)
    span = max(1, steps - warmup_steps)

    def decay(step: int) -> float:
        progress = min(1.0, (step - warmup_steps) / span)
        return final + (1 - final) * 0.5 * (1 + math.cos(math.pi * progress))

    return _after_warmup(warmup_steps, decay)


def schedule(name: str, warmup_steps: int, steps: int, *, final: float = 0.0) -> Schedule:
    """The factor function of schedule ``name`` (``constant``, ``linear``, ``cosine`` or a registered one).

    Raises:
        ValueError: an unknown name (listing the known ones) or bad step counts.
    """
    return SCHEDULES.get(name)(warmup_steps, steps, final=final)


def decays(name: str, parameter: torch.Tensor) -> bool:
    """The apps' one no-decay rule: matrices decay; vectors, scalars and `NO_DECAY_NAMES` do not."""
    return parameter.dim() >= 2 and name.rsplit(".", 1)[-1] not in NO_DECAY_NAMES


def param_groups(
    model: torch.nn.Module,
    weight_decay: float,
    *,
    lr: float | None = None,
    lr_scales: Iterable[tuple[str, float]] = (),
) -> list[dict[str, Any]]:
    """AdamW parameter groups of ``model``'s trainable parameters under the one no-decay rule (`decays`).

    Args:
        model: the model.
        weight_decay: decay of the matrices.
        lr: the peak learning rate (None: the optimizer's ``lr`` for every group).
        lr_scales: ``(name prefix, factor)`` pairs: parameters under the first matching prefix learn at
            ``factor * lr`` (needs ``lr``).

    Returns:
        Non-empty groups ``{"params", "weight_decay"[, "lr"]}``, in the order of first appearance.

    Raises:
        ValueError: ``lr_scales`` without ``lr``.
    """
    scales = list(lr_scales)
    if scales and lr is None:
        raise ValueError("lr_scales: scaling the learning rate of some parameters needs lr (got None)")
    groups: dict[tuple[bool, float], list[torch.nn.Parameter]] = {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        scale = next((factor for prefix, factor in scales if name.startswith(prefix)), 1.0)
        groups.setdefault((decays(name, parameter), scale), []).append(parameter)
    return [
        {"params": params, "weight_decay": weight_decay if decay else 0.0}
        | ({} if lr is None else {"lr": lr * scale})
        for (decay, scale), params in groups.items()
    ]
