"""Where the running statistics of an HF model's feature maps (OPRF's ``A``, SADERF's ``Psi``) may move.

A causal map's statistics are running averages over earlier training calls (``statistics_mode="running"``),
updated after use, fixed outside ``train()``, and updated once by a checkpointed step (the feature map
reuses its pass's statistics when the pass is recomputed in the backward pass). Inside an HF model they
also move only where they are saved: in full fine-tuning (every weight of the attention module trains;
``save_pretrained`` writes the statistics with them) and when only the feature map trains (attention
transfer). Where the attention's pretrained weights are frozen while something else in it trains (LoRA and
other adapters, which save the adapter only), or where nothing in it trains, they are fixed for the call
(``statistics_frozen``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

import rf_features


def saved_where_they_move(module: nn.Module, fm: nn.Module) -> bool:
    """Full fine-tuning of the attention ``module``, or training of its feature map ``fm`` alone."""
    own = {id(p) for p in fm.parameters()}
    outside = [p.requires_grad for p in module.parameters() if id(p) not in own]
    map_trains = any(p.requires_grad for p in fm.parameters())
    return (all(outside) and any(outside)) or (map_trains and not any(outside))


@contextmanager
def statistics_where_saved(module: nn.Module, fm: rf_features.FeatureMap) -> Iterator[None]:
    """Run the attention call inside with ``fm``'s statistics fixed unless they are saved where they move."""
    if not fm.training or fm.statistics_frozen or saved_where_they_move(module, fm):
        yield
        return
    fm.statistics_frozen = True
    try:
        yield
    finally:
        fm.statistics_frozen = False
