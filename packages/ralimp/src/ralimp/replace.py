"""Swap the MLP blocks of a model for linearized layers: `replace_mlp` and the layer registry."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ralimp.activations import activation_name
from ralimp.baselines import SNNK, EUGen, LowRank
from ralimp.layer import RaLiMP
from spectraformer_core import Registry

#: Layer kinds for `replace_mlp`: ``ralimp``, ``eugen``, ``snnk``, ``lowrank``.
LAYERS: Registry[type[nn.Module]] = Registry("layer kind")
LAYERS.register("ralimp")(RaLiMP)
LAYERS.register("eugen")(EUGen)
LAYERS.register("snnk")(SNNK)
LAYERS.register("lowrank")(LowRank)


def register(name: str, *, override: bool = False):
    """Class decorator adding a layer kind (a class with ``from_linear(linear, activation, **kw)``)."""
    return LAYERS.register(name, override=override)


def names(pattern: str | None = None) -> list[str]:
    """Registered layer kinds, optionally filtered by a shell pattern."""
    return LAYERS.names(pattern)


def create(kind: str | type, in_features: int, out_features: int, **kw) -> nn.Module:
    """Build the layer registered as ``kind`` (or the class itself)."""
    return LAYERS.get(kind)(in_features, out_features, **kw)


#: ``(up Linear, activation, down Linear)`` attribute names of the MLP layouts `find_mlp_blocks` knows:
#: timm ``Mlp`` and HF ViT 5.x ``mlp`` (fc1/act/fc2), nanoGPT ``MLP`` (c_fc/gelu/c_proj), and the
#: ``intermediate`` module of HF ViT 4.x (dense/intermediate_act_fn; its ``output.dense`` stays).
LAYOUTS: tuple[tuple[str, tuple[str, ...], str | None], ...] = (
    ("fc1", ("act", "act_fn", "activation_fn", "activation"), "fc2"),
    ("c_fc", ("gelu", "act", "activation"), "c_proj"),
    ("dense", ("intermediate_act_fn",), None),
)


@dataclass(frozen=True)
class MLPBlock:
    """An MLP block found in a model: the module, the names of its up projection and activation."""

    name: str
    module: nn.Module
    up: str
    act: str
    activation: str | None


def find_mlp_blocks(model: nn.Module) -> list[MLPBlock]:
    """Every MLP block of ``model`` in module order (see `LAYOUTS`).

    A block is a module holding an ``nn.Linear`` up projection followed by an activation attribute (a module
    or function) under one of the known names. ``activation`` is its registered name, or None if unknown.
    """
    blocks = []
    for name, module in model.named_modules():
        for up, acts, down in LAYOUTS:
            linear = getattr(module, up, None)
            if not isinstance(linear, nn.Linear) or (down is not None and not hasattr(module, down)):
                continue
            act = next((a for a in acts if getattr(module, a, None) is not None), None)
            if act is None:
                continue
            blocks.append(MLPBlock(name, module, up, act, activation_name(getattr(module, act))))
            break
    return blocks


def replace_mlp(
    model: nn.Module,
    kind: str | type = "ralimp",
    *,
    last_k: int | None = None,
    activation: str | None = None,
    **kw: object,
) -> list[str]:
    """Replace the MLP blocks of ``model`` (in place) by ``kind`` layers initialized from their weights.

    In each block the up projection ``Linear`` becomes ``kind.from_linear(up, activation, **kw)``, which
    computes ``activation(up(x))``, and the activation attribute becomes ``nn.Identity()``; everything
    else (dropout, norm, the down projection, HF ViT 4.x's ``output`` with its residual) is left as it was,
    so the block's ``forward`` is unchanged.

    Args:
        model: any ``nn.Module`` with timm ``Mlp``, HF ViT (4.x ``intermediate``/``output`` or 5.x
            ``mlp``) or nanoGPT ``MLP`` blocks.
        kind: ``"ralimp"``, ``"eugen"``, ``"snnk"``, ``"lowrank"`` or a registered name or class.
        last_k: replace only the last ``k`` blocks (all when None).
        activation: the activation name to approximate (default: read from each block).
        **kw: options of the layer class (``num_freqs=4``, ``weight_matrix="orf"``, ``seed=0``...).

    Returns:
        The names of the replaced blocks.
    """
    cls = LAYERS.get(kind)
    blocks = find_mlp_blocks(model)
    if not blocks:
        raise ValueError(f"model: found no MLP block (known layouts: {LAYOUTS}) in {type(model).__name__}")
    if last_k is not None:
        if isinstance(last_k, bool) or not isinstance(last_k, int) or not 0 < last_k <= len(blocks):
            raise ValueError(
                f"last_k: expected an integer in [1, {len(blocks)}] (the MLP blocks), got {last_k!r}"
            )
        blocks = blocks[-last_k:]
    for block in blocks:
        act = activation or block.activation
        if act is None:
            raise ValueError(
                f"activation: could not recognize the activation {getattr(block.module, block.act)!r} of "
                f"block {block.name!r}; pass activation='gelu' (or another registered name)"
            )
        seed = kw.get("seed")
        options = dict(kw)
        if seed is not None:
            options["seed"] = seed + blocks.index(block)
        setattr(block.module, block.up, cls.from_linear(getattr(block.module, block.up), act, **options))
        setattr(block.module, block.act, nn.Identity())
    return [block.name for block in blocks]
