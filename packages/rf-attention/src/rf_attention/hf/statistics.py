"""When the running statistics of an HF model's feature maps (OPRF's ``A``, SADERF's ``Psi``) update.

A causal map's statistics are running averages over earlier training calls (``statistics_mode="running"``),
updated after use. Inside an HF model:

- outside ``train()`` they are fixed;
- a training forward pass updates them once: a recomputation of the same pass (gradient checkpointing
  reruns each layer during the backward pass) uses the statistics the pass used and updates nothing, so
  its gradients are those of the pass. A pass is one call of the model's ``forward`` (a forward pre-hook
  counts them); under ``torch.compile`` the count is not read and recomputation is not recognized;
- they move only where they are saved: in full fine-tuning (every weight of the attention module trains;
  ``save_pretrained`` writes the statistics with them) and when only the feature map trains (attention
  transfer). Where the attention's pretrained weights are frozen while something else in it trains (LoRA
  and other adapters, which save the adapter only), or where nothing in it trains, they are fixed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

#: The prefix of a feature map's running-statistics buffers.
RUNNING = "running_"


@dataclass
class ForwardPasses:
    """The number of forward passes of one model, shared by its attention modules."""

    count: int = 0


def count_forward_passes(model: nn.Module) -> None:
    """Give ``model`` (once) a forward pre-hook counting its passes, and its attention modules the count."""
    passes = getattr(model, "rf_forward_passes", None)
    if not isinstance(passes, ForwardPasses):
        passes = ForwardPasses()
        model.rf_forward_passes = passes  # type: ignore[assignment]  # a plain attribute, not a tensor
        model.register_forward_pre_hook(_next_pass)  # a module-level function: the model still pickles
    for module in model.modules():
        if getattr(module, "rf_feature_map", None) is not None:
            module.rf_forward_passes = passes  # type: ignore[assignment]


def _next_pass(model: nn.Module, args: Any) -> None:
    model.rf_forward_passes.count += 1  # type: ignore[operator, union-attr]


def _running(fm: nn.Module) -> dict[str, torch.Tensor]:
    return {n: b for n, b in fm.named_buffers(recurse=False) if n.startswith(RUNNING)}


def _saved_where_they_move(module: nn.Module, fm: nn.Module) -> bool:
    """Full fine-tuning of the attention module, or training of its feature map alone."""
    own = {id(p) for p in fm.parameters()}
    outside = [p.requires_grad for p in module.parameters() if id(p) not in own]
    map_trains = any(p.requires_grad for p in fm.parameters())
    return (all(outside) and any(outside)) or (map_trains and not any(outside))


@contextmanager
def statistics_of_this_pass(module: nn.Module, fm: nn.Module) -> Iterator[None]:
    """Run the attention call inside with the statistics rules above (a no-op for maps without any)."""
    running = _running(fm)
    if not (fm.training and running):
        yield
        return
    passes = getattr(module, "rf_forward_passes", None)
    recomputing = False
    if isinstance(passes, ForwardPasses) and not torch.compiler.is_compiling():
        recomputing = getattr(module, "rf_statistics_pass", None) == passes.count
        if not recomputing:
            module.rf_statistics_pass = passes.count  # type: ignore[assignment]
            module.rf_statistics_used = {n: b.clone() for n, b in running.items()}  # type: ignore[assignment]
    if not recomputing and _saved_where_they_move(module, fm):
        yield
        return
    current = {n: b.clone() for n, b in running.items()}
    if recomputing:
        for name, used in module.rf_statistics_used.items():  # type: ignore[union-attr, operator]
            running[name].copy_(used)
    fm.eval()
    try:
        yield
    finally:
        fm.train()
        for name, value in current.items():
            running[name].copy_(value)
