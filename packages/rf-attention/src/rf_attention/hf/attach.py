"""Giving a loaded model's attention modules their feature maps, restoring saved ones, and the RF cache."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from rf_attention.hf.attention import PREFIX, registered
from rf_attention.hf.cache import is_attention_module, use_random_feature_cache_in_generate
from rf_attention.hf.persistence import leave_out_non_tensor_state, load_feature_maps, saved_feature_map_file

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def attach_feature_maps(model: PreTrainedModel, attn_implementation: str | None = None) -> int:
    """Create every attention layer's feature map now (seeded ``seed + layer index``), on its device.

    Call it after loading and before building the optimizer, so that learnable weight matrices
    (``fastfoodl``) are trained; otherwise each map is created at the layer's first forward pass. It also

    - restores the maps that ``save_pretrained`` wrote, when the model was loaded from a local folder
      whose safetensors hold ``rf_feature_map`` tensors (``from_pretrained`` leaves them out);
    - makes ``model.generate`` use a [`RandomFeatureCache`][rf_attention.hf.RandomFeatureCache] (the
      recurrent state per layer, O(1) per token) wherever it would build HF's ``DynamicCache``.

    Args:
        model: a transformers model whose attention dispatches through ``AttentionInterface``.
        attn_implementation: the ``"rf-..."`` name; default: ``model.config._attn_implementation``.

    Returns:
        The number of attention modules that got a feature map.
    """
    name = attn_implementation or model.config._attn_implementation
    function = registered(name)
    if function is None:
        raise ValueError(f"attn_implementation: expected a registered {PREFIX}* name, got {name!r}")
    count = 0
    for module in model.modules():
        if is_attention_module(module):
            layer = getattr(module, "layer_idx", None)
            causal = bool(getattr(module, "is_causal", True))
            function.feature_map(
                module, cast(int, module.head_dim), causal, count if layer is None else layer, attaching=True
            )
            count += 1
    leave_out_non_tensor_state(model)
    saved = saved_feature_map_file(getattr(model.config, "_name_or_path", None))
    if saved is not None:
        load_feature_maps(model, saved.parent)
    use_random_feature_cache_in_generate(model)
    return count
