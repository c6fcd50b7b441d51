"""Feature maps on a model's attention modules from its creation: construction, loading, switching.

Importing ``rf_attention.hf`` wraps three public methods of ``transformers.PreTrainedModel`` (the original
runs first, then [`attach_feature_maps`][rf_attention.hf.attach_feature_maps] where the model's
``attn_implementation`` is an ``rf-*`` name): ``post_init`` (a model built from its config, ``Model(config)``
or ``from_config``), ``from_pretrained`` (after the weights are loaded: the maps saved beside them are
restored) and ``set_attn_implementation``. So the maps are registered submodules before any optimizer is
built, and ``generate`` keeps the recurrent state from its first call, whichever way the attention was set.
It also wraps the check that every model's ``__init__`` runs first, ``_check_and_adjust_attn_implementation``,
so that an ``rf-*`` name is checked before any module is built (unknown names, model classes outside
``AttentionInterface``). transformers has no public hook after construction, loading or a switch, nor
before its modules are built; for any other name the wrappers change nothing. The guide lists every change
the import makes.
"""

from __future__ import annotations

import functools
import warnings
from typing import TYPE_CHECKING, Any, cast

from torch import nn
from transformers import PreTrainedModel

from rf_attention.hf.attention import (
    PREFIX,
    changed_since_drawn,
    known,
    registered,
    unknown_name,
)
from rf_attention.hf.cache import use_random_feature_cache_in_generate
from rf_attention.hf.layers import (
    SOFTMAX_ATTRIBUTE,
    check_dispatches_through_interface,
    head_dim_of,
    is_attention_module,
)
from rf_attention.hf.persistence import leave_out_non_tensor_state, load_feature_maps, saved_feature_map_file

if TYPE_CHECKING:
    from collections.abc import Callable

#: The config attribute that records the feature maps' options (``num_features``, ``seed``, ...).
CONFIG_OPTIONS = "rf_attention"
#: The config attribute that tells a reader of ``config.json`` what loads it (transformers itself only
#: says that the ``rf-*`` ``attn_implementation`` is not supported).
CONFIG_IMPORT_HINT = "rf_attention_requires"
IMPORT_HINT = (
    "import rf_attention.hf before from_pretrained (pip install 'rf-attention[hf]'): it registers the rf-* "
    "attn_implementation and restores the feature maps"
)


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
    switch = attn_implementation is not None and attn_implementation != target.config._attn_implementation
    check_dispatches_through_interface(target, switch=switch)
    if attn_implementation is not None and switch:
        known("attn_implementation", attn_implementation)
        target.set_attn_implementation(attn_implementation)  # which attaches the maps
    count = _attach(target)[0]
    if not count:
        raise ValueError(f"model: {no_attention_modules(target)}")
    return count


def no_attention_modules(model: nn.Module) -> str:
    """The message for a model in which no attention module was found."""
    return (
        f"no attention module in {type(model).__name__} (a module with a config, a scaling and a head_dim "
        "or head_size, as transformers' attention modules have)"
    )


def attention_layers(model: nn.Module) -> list[tuple[str, nn.Module, int, int]]:
    """``(name, module, layer index, head width)`` of each HF attention module of ``model``, in order.

    The layer index is the module's ``layer_idx``, else its position among the attention modules.
    """
    found = [(name, module) for name, module in model.named_modules() if is_attention_module(module)]
    layers = []
    for i, (name, module) in enumerate(found):
        layer = getattr(module, "layer_idx", None)
        layers.append((name, module, i if layer is None else layer, cast(int, head_dim_of(module))))
    return layers


def warn_if_trained_maps_dropped(
    modules: list[nn.Module], replacement: str, *, pair: str | None = None
) -> None:
    """Warn when maps that changed since drawn (trained or loaded) are to be replaced by ``replacement``.

    Args:
        modules: the attention modules whose maps are replaced.
        replacement: the attention name that draws the new maps.
        pair: only maps of another pair are replaced (a switch); None: every map (a conversion).
    """
    dropped: dict[str, int] = {}
    for module in modules:
        current = getattr(module, "rf_feature_map", None)
        owner = getattr(module, "rf_attention_name", None)
        if current is not None and owner != pair and changed_since_drawn(current):
            dropped[str(owner)] = dropped.get(str(owner), 0) + 1
    for owner, count in dropped.items():
        warnings.warn(
            f"{owner}: {count} attention layers have trained feature maps (changed since drawn) that "
            f"{replacement} replaces with fresh draws; they are lost (switching back draws fresh ones too). "
            "Save them first (model.save_pretrained), or train the new maps",
            stacklevel=3,
        )


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
    function = registered(name)
    if function is None and not str(name).startswith(PREFIX):
        raise ValueError(
            f"attn_implementation: expected a registered {PREFIX}* name, got {name!r}; convert the model "
            "with rf_attention.hf.linearize(model, 'posrf-orf'), or load it with "
            "attn_implementation='rf-posrf-orf'"
        )
    if function is None:
        raise unknown_name("attn_implementation", name)
    check_dispatches_through_interface(model)
    recorded = getattr(model.config, CONFIG_OPTIONS, None)
    if isinstance(recorded, dict):
        function = function.with_options(recorded)  # a saved or converted model's options
    layers = attention_layers(model)
    warn_if_trained_maps_dropped([module for _, module, _, _ in layers], name, pair=function.pair)
    fresh = []
    for module_name, module, layer, head_dim in layers:
        if function.keeps_softmax(layer):
            function.keep_softmax(module)
            continue
        if hasattr(module, SOFTMAX_ATTRIBUTE):  # kept by an earlier conversion, converted now
            delattr(module, SOFTMAX_ATTRIBUTE)
        before = getattr(module, "rf_feature_map", None)
        causal = bool(getattr(module, "is_causal", True))
        if function.feature_map(module, head_dim, causal, layer, attaching=True) is not before:
            fresh.append(f"{module_name}.")
    leave_out_non_tensor_state(model)
    saved = saved_feature_map_file(getattr(model.config, "_name_or_path", None))
    # only maps drawn now: a map already attached may have trained since loading
    restored = load_feature_maps(model, saved.parent, modules=fresh) if saved is not None and fresh else 0
    model.config.attn_implementation = name
    setattr(model.config, CONFIG_OPTIONS, function.options)
    setattr(model.config, CONFIG_IMPORT_HINT, IMPORT_HINT)
    use_random_feature_cache_in_generate(model)
    return len(layers), restored


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
            if hasattr(self.config, CONFIG_IMPORT_HINT):
                delattr(self.config, CONFIG_IMPORT_HINT)
        return result

    return set_attn_implementation


def _checking_rf_names_first(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def check_and_adjust(self: PreTrainedModel, attn_implementation: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(attn_implementation, str) and attn_implementation.startswith(PREFIX):
            known("attn_implementation", attn_implementation)
            check_dispatches_through_interface(type(self))
        return original(self, attn_implementation, *args, **kwargs)

    return check_and_adjust


def install() -> None:
    """Wrap ``PreTrainedModel``'s methods that set or check the attention and build or load a model (once).

    ``post_init``, ``from_pretrained`` and ``set_attn_implementation`` attach the maps after the original
    ran; ``_check_and_adjust_attn_implementation``, which transformers runs first in every model's
    ``__init__`` (``Model(config)``, ``from_config``, ``from_pretrained``) and in ``set_attn_implementation``,
    checks an ``rf-*`` name before any module is built: an unknown one with the closest known names, a class
    that computes its attention itself (Falcon, which would fail on its own dict lookup) by name.
    """
    if getattr(PreTrainedModel, "_rf_attention_installed", False):
        return
    check = _checking_rf_names_first(PreTrainedModel._check_and_adjust_attn_implementation)
    PreTrainedModel._check_and_adjust_attn_implementation = check  # type: ignore[method-assign]
    PreTrainedModel.post_init = _after_post_init(PreTrainedModel.post_init)  # type: ignore[method-assign]
    from_pretrained = PreTrainedModel.__dict__["from_pretrained"].__func__
    PreTrainedModel.from_pretrained = _after_from_pretrained(from_pretrained)  # type: ignore[method-assign]
    switch = _after_set_attn_implementation(PreTrainedModel.set_attn_implementation)
    PreTrainedModel.set_attn_implementation = switch  # type: ignore[method-assign]
    PreTrainedModel._rf_attention_installed = True  # type: ignore[attr-defined]
