"""Changes made to a pretrained ViT: last k MLPs linearized, their attention swapped, MLP pairs compressed.

Usage:

    replace_mlps(model, "ralimp", last_k=4, features=32, inputs=x, init="lstsq")  # ralimp.replace_mlp
    swap_attention(model, "performer", last_k=4, num_features=128)    # rf_attention.create, qkv/proj copied
    fast = compressed(model)                                          # fc2 folded into each linearized fc1
"""

from __future__ import annotations

import copy

import torch
from torch import nn

import ralimp
import rf_attention
from spectraformer_core import check_int
from vit_finetune.model import ViT

#: The layer name that keeps the dense MLPs.
DENSE = "dense"

#: Options of a kind beyond its budget. One departure from the paper: RaLiMP's and SNNK's
#: ``balance="auto"`` (the literal value is 1), which rescales ``x`` and ``w`` against each other so that
#: the features' variance starts finite at LayerNorm'd inputs (SNNK's exponential features at balance 1
#: do not train: ``|phi(x)| = exp(sqrt(xi / 2) g . x)`` with ``||x|| ~ sqrt(d)``).
LAYER_OPTIONS: dict[str, dict] = {"ralimp": {"balance": "auto"}, "snnk": {"balance": "auto"}}


def replace_mlps(
    model: nn.Module,
    layer: str,
    *,
    last_k: int,
    features: int,
    seed: int = 0,
    inputs: torch.Tensor | None = None,
    init: str = "psi",
    weight_matrix: str | None = None,
    **options: object,
) -> list[str]:
    """Replace the MLPs of the last ``last_k`` blocks by ``layer`` layers spending ``features``, in place.

    Each up projection becomes ``ralimp.create(layer, fc1, "gelu", budget=features)`` (through
    ``ralimp.replace_mlp``, which owns the budget rule: exactly ``features`` random features), initialized
    from the current (pretrained) weights; the other blocks are not touched.

    Args:
        model: the ViT.
        layer: ``"dense"`` (no change) or a ``ralimp`` layer kind (``ralimp``, ``eugen``, ``snnk``,
            ``lowrank``).
        last_k: how many of the last blocks.
        features: the random-feature budget of each layer.
        seed: seed of the projections (block ``i`` of the replaced ones gets ``seed + i``).
        inputs: images ``(B, 3, S, S)`` the model runs on once (eval mode) before the replacement: the
            inputs each replaced ``fc1`` receives calibrate its layer (scales, and the readout for
            ``init="lstsq"``).
        init: ``"psi"`` (the paper's ``Psi(W)``) or ``"lstsq"`` (needs ``inputs``).
        weight_matrix: ``rf_matrices`` name of the projections; None: the layer's default.
        **options: more keywords of ``ralimp.create`` (``fit``, ``num_atoms``), over `LAYER_OPTIONS`.

    Returns:
        The names of the replaced MLP modules (``[]`` for ``dense``).
    """
    if layer == DENSE:
        return []
    if layer not in ralimp.LAYERS:
        raise ValueError(f"layer: unknown {layer!r}; expected one of {', '.join(layer_names())}")
    overrides = dict(LAYER_OPTIONS.get(layer, {})) | options
    if weight_matrix is not None:
        overrides["weight_matrix"] = weight_matrix
    return ralimp.replace_mlp(
        model, layer, budget=features, last_k=last_k, inputs=inputs, init=init, seed=seed, **overrides
    )


def layer_names() -> list[str]:
    """``dense`` and every ``ralimp`` layer kind."""
    return ralimp.names()


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
    check_int("last_k", last_k, 1, maximum=depth)
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
