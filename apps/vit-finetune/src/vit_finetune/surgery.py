"""Changes made to a pretrained ViT: last k MLPs linearized, their attention swapped, MLP pairs compressed.

Usage:

    replace_mlps(model, "ralimp", last_k=4, features=32, seed=0)      # ralimp.replace_mlp with a budget
    swap_attention(model, "performer", last_k=4, num_features=128)    # rf_attention.create, qkv/proj copied
    fast = compressed(model)                                          # fc2 folded into each linearized fc1
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

import ralimp
import rf_attention
from spectraformer_core import Registry
from vit_finetune.model import ViT

#: ``layer kind -> (features -> constructor options)``: how a budget of ``F`` random features is spent.
#: RaLiMP splits it as the paper's Sec. D.1 does at ``F = 32`` (``F/4`` polynomial features, one atom, 3
#: Gauss-Laguerre nodes of ``F/8`` projections: ``F/4 + 2 * 3 * F/8 = F``); EUGen and SNNK take ``F``
#: features, LowRank rank ``F``. Kinds without an entry get only the options given explicitly.
BUDGETS: Registry[Callable[[int], dict]] = Registry("budget")
BUDGETS.register("ralimp")(
    lambda f: {
        "poly_features": max(1, f // 4),
        "num_atoms": 1,
        "num_freqs": 3,
        "freq_features": max(1, f // 8),
    }
)
BUDGETS.register("eugen")(lambda f: {"num_features": f})
BUDGETS.register("snnk")(lambda f: {"num_features": f})
BUDGETS.register("lowrank")(lambda f: {"rank": f})

#: The layer name that keeps the dense MLPs.
DENSE = "dense"


def layer_names() -> list[str]:
    """``dense`` and every ``ralimp`` layer kind."""
    return [DENSE, *ralimp.names()]


def replace_mlps(
    model: nn.Module,
    layer: str,
    *,
    last_k: int,
    features: int,
    seed: int = 0,
    options: dict | None = None,
) -> list[str]:
    """Replace the MLPs of the last ``last_k`` blocks by ``layer`` (``ralimp.replace_mlp``), in place.

    Each up projection becomes ``layer.from_linear(fc1, "gelu", ...)`` initialized from the current
    (pretrained) weights; the other blocks are not touched.

    Args:
        model: the ViT.
        layer: ``"dense"`` (no change) or a ``ralimp`` layer kind (``ralimp``, ``eugen``, ``snnk``,
            ``lowrank``).
        last_k: how many of the last blocks.
        features: the random-feature budget ``F`` (see `BUDGETS`).
        seed: seed of the projections (block ``i`` of the replaced ones gets ``seed + i``).
        options: more constructor options, winning over the budget's (``{"weight_matrix": "orf"}``).

    Returns:
        The names of the replaced MLP modules (``[]`` for ``dense``).
    """
    if layer == DENSE:
        return []
    if layer not in ralimp.LAYERS:
        raise ValueError(f"layer: unknown {layer!r}; expected one of {', '.join(layer_names())}")
    if features < 1:
        raise ValueError(f"features: expected an integer >= 1, got {features}")
    kw = BUDGETS.get(layer)(features) if layer in BUDGETS else {}
    kw.update(options or {})
    return ralimp.replace_mlp(model, layer, last_k=last_k, seed=seed, **kw)


def swap_attention(
    model: ViT, name: str, *, last_k: int, num_features: int = 128, seed: int = 0, **kw
) -> dict[str, list[str]]:
    """Replace the attention of the last ``last_k`` blocks by ``rf_attention.create(name, ...)``, in place.

    The pretrained parameters are copied wherever the new module has a tensor of the same name and shape
    (``qkv.*`` and ``proj.*`` for every ``rf_attention`` module built on its shared projections).

    Returns:
        ``{"copied": [...], "new": [...]}``: the new modules' parameter names, per block, that came from the
        pretrained attention and those that start from their own initialization.
    """
    depth = len(model.blocks)
    if isinstance(last_k, bool) or not isinstance(last_k, int) or not 0 < last_k <= depth:
        raise ValueError(f"last_k: expected an integer in [1, {depth}] (the blocks), got {last_k!r}")
    config = model.config
    copied, new = [], []
    for index in range(depth - last_k, depth):
        block = model.blocks[index]
        old = block.attn.state_dict()
        attention = rf_attention.create(
            name,
            config.dim,
            config.num_heads,
            num_features=num_features,
            dropout=config.dropout,
            seed=seed + index,
            **kw,
        )
        reference = next(iter(block.attn.parameters()))
        attention.to(device=reference.device, dtype=reference.dtype)
        state = attention.state_dict()
        with torch.no_grad():
            for key, value in state.items():
                if not isinstance(value, torch.Tensor):  # extra states (generator states of the features)
                    continue
                if isinstance(old.get(key), torch.Tensor) and old[key].shape == value.shape:
                    value.copy_(old[key])
                    copied.append(f"blocks.{index}.attn.{key}")
                elif value.is_floating_point():
                    new.append(f"blocks.{index}.attn.{key}")
        block.attn = attention
    return {"copied": copied, "new": new}


def compressed(model: nn.Module) -> nn.Module:
    """A copy of ``model`` for inference with every linearized ``fc1`` and its ``fc2`` folded into one layer.

    ``fc2(layer(x)) = W' Psi(W) Phi(x) + b'`` (RaLiMP App. B, ``FeatureLinearization.compress``); the
    output is unchanged up to rounding. Layers without ``compress`` (LowRank, dense) are kept as they are.
    """
    model = copy.deepcopy(model)
    for module in model.modules():
        fc1, fc2 = getattr(module, "fc1", None), getattr(module, "fc2", None)
        if isinstance(fc1, ralimp.FeatureLinearization) and isinstance(fc2, nn.Linear):
            module.fc1 = fc1.compress(fc2)
            module.fc2 = nn.Identity()
    return model


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters (compressed layers' fixed feature maps hold buffers, not parameters)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
