"""Conversion of a pretrained softmax model to random-feature attention, in place."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from rf_attention.hf.attach import (
    CONFIG_OPTIONS,
    attention_layers,
    no_attention_modules,
    transformers_model,
    warn_if_trained_maps_dropped,
)
from rf_attention.hf.attention import PREFIX, known
from rf_attention.hf.layers import check_dispatches_through_interface
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
    input_map: bool = True,
    seed: int | None = None,
    window: int = 0,
    softmax_layers: Sequence[int] = (),
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

    Atomic: every argument is checked and every map is built before the model changes, so a failure leaves
    it as it was. Maps it replaces that changed since drawn (trained) are named in a warning.

    Args:
        model: a transformers ``PreTrainedModel`` whose attention dispatches through ``AttentionInterface``
            (Llama, Mistral, Qwen2/3, GPT-2, GPT-NeoX, ...; not a ``peft`` model: convert the base model
            first, then wrap it).
        name: a random-feature pair, ``"posrf-orf"`` or ``"rf-posrf-orf"`` (``"performer"`` too), or a
            learned map, ``"hedgehog"`` or ``"t2r"`` (``rf_features.learned``).
        num_features: rows ``s`` of each weight matrix.
        learnable: per-head trainable weight matrices; False: one fixed random map per layer, shared by the
            heads.
        input_map: with ``learnable``, a trainable linear map of the queries and one of the keys per head
            before the features (identity at the start): the largest single gain of attention transfer on
            peaked attention (the guide "Linearizing a pretrained model").
        seed: layer ``i`` draws from ``seed + i`` (default: the registered name's seed, 0).
        window: the sliding-window hybrid in every layer (causal models): the last ``window`` positions
            by the exact softmax weights, earlier ones by the features, one normalizer (a learned map mixes
            the two by LoLCATs' trained per-head factor, its ``window_logit``)
            ([`rf_attention`][rf_attention.rf_attention]); recorded in the config; ``generate``'s cache
            keeps a ring of the last ``window`` keys and values per layer beside the state. 0: none.
        softmax_layers: layer indices (``layer_idx``) kept as they are, softmax attention (``sdpa``) with
            their KV cache in ``generate``: no map, nothing for attention transfer to train; recorded in the
            config. At least one layer must be converted.

    Returns:
        ``model``.

    Raises:
        ValueError: an unknown name (with the closest known ones), bad ``num_features``, ``seed`` or
            ``softmax_layers`` (not layer indices of the model, or every layer), a
            ``peft`` model, a model whose attention does not dispatch through ``AttentionInterface``
            (Falcon, ...), or one with no attention module.
    """
    function = known("name", name)
    target = transformers_model(model)
    _refuse_peft(model)
    check_dispatches_through_interface(target, switch=True)
    check_int("num_features", num_features)
    check_int("window", window, minimum=0)
    if seed is not None:
        check_int("seed", seed, minimum=None)
    heads = target.config.get_text_config(decoder=True).num_attention_heads
    options = {
        **function.feature_options,
        "learnable": learnable,
        "num_heads": heads if learnable else None,
        "input_map": learnable and input_map,
    }
    record = {"num_features": num_features, "seed": function.seed if seed is None else seed, **options}
    if window:
        record["window"] = window
    kept = sorted({check_int("softmax_layers", layer, minimum=0) for layer in softmax_layers})
    if kept:
        record["softmax_layers"] = kept
    converted = function.with_options(record)
    layers = attention_layers(target)
    if not layers:
        raise ValueError(f"model: {no_attention_modules(target)}")
    indices = {layer for _, _, layer, _ in layers}
    if not set(kept) <= indices or set(kept) == indices:
        raise ValueError(
            f"softmax_layers: expected some of the model's layers {sorted(indices)} and not all of them "
            f"(at least one is converted), got {kept}"
        )
    converted_layers = [entry for entry in layers if not converted.keeps_softmax(entry[2])]
    maps = [  # every map first: a failure here leaves the model unchanged
        (module, converted.new_feature_map(module, head_dim, bool(getattr(module, "is_causal", True)), layer))
        for _, module, layer, head_dim in converted_layers
    ]
    warn_if_trained_maps_dropped([module for _, module, _, _ in layers], converted.name)
    for module, fm in maps:
        converted.attach(module, fm)
    setattr(target.config, CONFIG_OPTIONS, record)
    target.set_attn_implementation(f"{PREFIX}{name.removeprefix(PREFIX)}")  # attaches the cache too
    return model


def _refuse_peft(model: nn.Module) -> None:
    """Refuse a ``peft`` model: maps added inside it would train but not be saved with the adapter."""
    if any(type(module).__module__.split(".")[0] == "peft" for module in model.modules()):
        raise ValueError(
            f"model: a peft model ({type(model).__name__}); feature maps added inside it train with the "
            "adapter but peft's save_pretrained writes the adapter's weights only, so a reloaded adapter "
            "would run fresh maps. Instead linearize the base model before get_peft_model (train its maps "
            "with attention_transfer or full fine-tuning and save_pretrained it), then wrap it"
        )
