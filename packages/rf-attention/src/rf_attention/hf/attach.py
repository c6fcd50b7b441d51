"""Feature maps on a model's attention modules from its creation: construction, loading, switching.

Importing ``rf_attention.hf`` wraps three public methods of ``transformers.PreTrainedModel`` (the original
runs first, then [`attach_feature_maps`][rf_attention.hf.attach_feature_maps] where the model's
``attn_implementation`` is an ``rf-*`` name): ``post_init`` (a model built from its config, ``Model(config)``
or ``from_config``), ``from_pretrained`` (after the weights are loaded: the maps saved beside them are
restored) and ``set_attn_implementation``. So the maps are registered submodules before any optimizer is
built, and ``generate`` keeps the recurrent state from its first call, whichever way the attention was set.
"""

from __future__ import annotations

import functools
import warnings
from typing import TYPE_CHECKING, Any, cast

from torch import nn
from transformers import PreTrainedModel

from rf_attention.hf.attention import PREFIX, WINDOW_ATTRIBUTE, HFRandomFeatureAttention, registered
from rf_attention.hf.cache import is_attention_module, use_random_feature_cache_in_generate
from rf_attention.hf.persistence import leave_out_non_tensor_state, load_feature_maps, saved_feature_map_file

if TYPE_CHECKING:
    from collections.abc import Callable

#: The config attribute that records the feature maps' options (``num_features``, ``seed``, ...).
CONFIG_OPTIONS = "rf_attention"


def attach_feature_maps(model: nn.Module, attn_implementation: str | None = None) -> int:
    """Create every attention layer's feature map now (seeded ``seed + layer index``), on its device.

    ``from_pretrained``, ``set_attn_implementation`` and building a model from its config do it by
    themselves once ``rf_attention.hf`` is imported; call it on a model whose attention was set another way
    (a config edited after construction, a model wrapped by ``peft``). Existing maps of the same pair are
    kept. New maps take the options the config records (a saved or converted model's ``rf_attention``
    entry), else those the name was registered with. It also

    - restores the maps that ``save_pretrained`` wrote, when the model was loaded from a local folder
      whose safetensors hold ``rf_feature_map`` tensors;
    - records the name and the maps' options in the config (``attn_implementation`` and
      ``rf_attention``), so that ``save_pretrained`` then ``from_pretrained`` gives the RF model again;
    - makes ``model.generate`` use a [`RandomFeatureCache`][rf_attention.hf.RandomFeatureCache] (the
      recurrent state per layer, O(1) per token) wherever it would build HF's ``DynamicCache``.

    Args:
        model: a transformers model whose attention dispatches through ``AttentionInterface``, or a module
            holding one (a ``peft.PeftModel``).
        attn_implementation: the ``"rf-..."`` name; default: the model config's ``_attn_implementation``
            (another name switches the model to it, as ``set_attn_implementation``).

    Returns:
        The number of attention modules that got a feature map.
    """
    target = transformers_model(model)
    if attn_implementation is not None and attn_implementation != target.config._attn_implementation:
        if registered(attn_implementation) is None:
            raise ValueError(
                f"attn_implementation: expected a registered {PREFIX}* name, got {attn_implementation!r}"
            )
        target.set_attn_implementation(attn_implementation)  # which attaches the maps
    return _attach(target)[0]


def transformers_model(model: nn.Module) -> PreTrainedModel:
    """``model`` itself, or the outermost ``PreTrainedModel`` inside it (``peft`` wraps one)."""
    found = next((m for m in model.modules() if isinstance(m, PreTrainedModel)), None)
    if found is None:
        raise ValueError(
            f"model: expected a transformers PreTrainedModel or a wrapper of one, got {type(model)}"
        )
    return found


def _attach(model: PreTrainedModel) -> tuple[int, int]:
    """[`attach_feature_maps`][rf_attention.hf.attach_feature_maps]; also the number of tensors restored."""
    name = model.config._attn_implementation
    function = _with_recorded_options(registered(name), model.config)
    if function is None:
        raise ValueError(f"attn_implementation: expected a registered {PREFIX}* name, got {name!r}")
    count, fresh = 0, []
    for module_name, module in model.named_modules():
        if is_attention_module(module):
            layer = getattr(module, "layer_idx", None)
            causal = bool(getattr(module, "is_causal", True))
            head_dim = cast(int, module.head_dim)
            before = getattr(module, "rf_feature_map", None)
            fm = function.feature_map(
                module, head_dim, causal, count if layer is None else layer, attaching=True
            )
            setattr(module, WINDOW_ATTRIBUTE, function.window)
            if fm is not before:
                fresh.append(f"{module_name}.")
            count += 1
    leave_out_non_tensor_state(model)
    saved = saved_feature_map_file(getattr(model.config, "_name_or_path", None))
    # only maps drawn now: a map already attached may have trained since loading
    restored = load_feature_maps(model, saved.parent, modules=fresh) if saved is not None and fresh else 0
    model.config.attn_implementation = name
    setattr(model.config, CONFIG_OPTIONS, _options(function))
    use_random_feature_cache_in_generate(model)
    return count, restored


def _with_recorded_options(
    function: HFRandomFeatureAttention | None, config: Any
) -> HFRandomFeatureAttention | None:
    """``function``, or a copy with the options the config records (a saved or converted model's)."""
    recorded = getattr(config, CONFIG_OPTIONS, None)
    if function is None or not isinstance(recorded, dict) or recorded == _options(function):
        return function
    options = {**function.feature_options, **recorded}
    return HFRandomFeatureAttention(
        function.component,
        function.weight_matrix,
        num_features=options.pop("num_features", function.num_features),
        seed=options.pop("seed", function.seed),
        name=function.name,
        window=options.pop("window", 0),
        **options,
    )


def _options(function: HFRandomFeatureAttention) -> dict[str, Any]:
    """What the config records of ``function``: ``num_features``, ``seed``, the feature options, a window."""
    window = {"window": function.window} if function.window else {}
    return {
        "num_features": function.num_features,
        "seed": function.seed,
        **window,
        **function.feature_options,
    }


def _runs_random_features(model: PreTrainedModel) -> bool:
    return registered(model.config._attn_implementation) is not None


def _on_meta_device(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def _after_post_init(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def post_init(self: PreTrainedModel) -> None:
        original(self)
        if _runs_random_features(self) and not _on_meta_device(
            self
        ):  # from_pretrained attaches after loading
            _attach(self)

    return post_init


def _after_from_pretrained(original: Callable[..., Any]) -> Any:
    @functools.wraps(original)
    def from_pretrained(cls: type[PreTrainedModel], *args: Any, **kwargs: Any) -> Any:
        result = original(cls, *args, **kwargs)
        model = result[0] if isinstance(result, tuple) else result
        if isinstance(model, PreTrainedModel) and _runs_random_features(model):
            count, restored = _attach(model)
            if not restored:
                options = getattr(model.config, CONFIG_OPTIONS)
                warnings.warn(
                    f"{model.config._attn_implementation}: no saved feature maps for "
                    f"{model.config._name_or_path!r} (they are read from a local folder's safetensors); "
                    f"{count} attention layers drew fresh ones (seed {options['seed']} + layer index, "
                    f"{options['num_features']} features). Train them, or load saved ones with "
                    "rf_attention.hf.load_feature_maps(model, folder)",
                    stacklevel=2,
                )
        return result

    return classmethod(from_pretrained)


def _after_set_attn_implementation(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def set_attn_implementation(self: PreTrainedModel, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        if _runs_random_features(self):
            _attach(self)
        elif str(getattr(self.config, "attn_implementation", "")).startswith(PREFIX):
            del self.config.attn_implementation  # the record of an earlier rf-* attention
        return result

    return set_attn_implementation


def install() -> None:
    """Wrap ``PreTrainedModel.post_init``, ``from_pretrained`` and ``set_attn_implementation`` (once)."""
    if getattr(PreTrainedModel, "_rf_attention_installed", False):
        return
    PreTrainedModel.post_init = _after_post_init(PreTrainedModel.post_init)  # type: ignore[method-assign]
    from_pretrained = PreTrainedModel.__dict__["from_pretrained"].__func__
    PreTrainedModel.from_pretrained = _after_from_pretrained(from_pretrained)  # type: ignore[method-assign]
    switch = _after_set_attn_implementation(PreTrainedModel.set_attn_implementation)
    PreTrainedModel.set_attn_implementation = switch  # type: ignore[method-assign]
    PreTrainedModel._rf_attention_installed = True  # type: ignore[attr-defined]
