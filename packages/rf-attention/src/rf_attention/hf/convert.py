"""Conversion of a pretrained softmax model to random-feature attention, in place."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from rf_attention.hf.attach import CONFIG_OPTIONS, transformers_model
from rf_attention.hf.attention import PREFIX, registered
from spectraformer_core import check_int

if TYPE_CHECKING:
    from torch import nn

Model = TypeVar("Model", bound="nn.Module")


def linearize(
    model: Model,
    name: str,
    *,
    num_features: int = 128,
    learnable: bool = True,
    seed: int | None = None,
    window: int = 0,
) -> Model:
    """Turn every attention layer of a loaded transformers ``model`` into random-feature attention ``name``.

    In place: the model keeps its weights, its ``attn_implementation`` becomes ``"rf-<pair>"`` and each
    attention module (grouped-query ones included) gets a fresh feature map on its device, seeded
    ``seed + layer index``. With ``learnable=True`` each map is per head (one ``(s, Dh)`` weight matrix for
    each query head, initialized by its draw) and trainable: ``transformers.Trainer``, attention transfer
    ([`attention_transfer`][rf_attention.transfer.attention_transfer]) or any optimizer built afterwards
    trains it. ``generate`` keeps the recurrent state (O(1) per token). The config records the name and the
    options, so ``save_pretrained`` then ``from_pretrained`` gives the converted model with its learned maps,
    with no further call.

    Args:
        model: a transformers ``PreTrainedModel`` (or a wrapper of one, such as a ``peft`` model) whose
            attention dispatches through ``AttentionInterface``.
        name: a random-feature pair, ``"posrf-orf"`` or ``"rf-posrf-orf"`` (``"performer"`` too).
        num_features: rows ``s`` of each weight matrix.
        learnable: per-head trainable weight matrices; False: one fixed random map per layer, shared by the
            heads.
        seed: layer ``i`` draws from ``seed + i`` (default: the registered name's seed, 0).
        window: the sliding-window hybrid in every layer (causal models): the last ``window`` positions
            by the exact softmax weights, earlier ones by the features, one normalizer
            ([`rf_attention`][rf_attention.rf_attention]); recorded in the config; ``generate``'s cache
            keeps a ring of the last ``window`` keys and values per layer beside the state. 0: none.

    Returns:
        ``model``.
    """
    implementation = f"{PREFIX}{name.removeprefix(PREFIX)}"
    function = registered(implementation)
    if function is None:
        raise ValueError(f"name: expected a random-feature attention name such as 'posrf-orf', got {name!r}")
    check_int("window", window, minimum=0)
    target = transformers_model(model)
    for module in target.modules():
        if hasattr(module, "rf_feature_map"):
            del module.rf_feature_map  # drawn afresh with these options
    heads = target.config.get_text_config(decoder=True).num_attention_heads
    options = {**function.feature_options, "learnable": learnable, "num_heads": heads if learnable else None}
    record = {"num_features": num_features, "seed": function.seed if seed is None else seed, **options}
    if window:
        record["window"] = window
    setattr(target.config, CONFIG_OPTIONS, record)
    target.set_attn_implementation(implementation)  # which attaches the maps (rf_attention.hf.attach)
    return model
