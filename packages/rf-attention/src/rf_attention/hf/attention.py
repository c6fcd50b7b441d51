"""The function HF calls for an ``rf-*`` attention, and its registration with ``AttentionInterface``."""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import rf_features
from rf_attention.decoding import attend_after_cached_keys
from rf_attention.hf.cache import CACHE_LAYER_KWARG, RecurrentCacheLayer, pending_cache_layer
from rf_attention.hf.layers import SOFTMAX_ATTRIBUTE
from rf_attention.hf.masks import key_padding_from_mask, mask_allows_packing, packed_cu_seqlens
from rf_attention.hf.persistence import saved_feature_map_file
from rf_attention.hf.statistics import statistics_where_saved
from rf_attention.modules import layer_attention
from rf_attention.registry import feature_pair
from rf_attention.registry import names as attention_names
from spectraformer_core import check_int

#: Prefix of the names registered with ``transformers.AttentionInterface``.
PREFIX = "rf-"
#: The attribute of an HF attention module that holds its sliding window (set when its map is attached).
WINDOW_ATTRIBUTE = "rf_window"
#: Keyword arguments of HF attention calls that ask for something RF attention cannot do.
_UNSUPPORTED = ("softcap", "s_aux", "position_bias")


class HFRandomFeatureAttention:
    """The function HF calls as ``attention_interface(module, query, key, value, attention_mask, ...)``.

    Args:
        component: an ``rf_features`` component name.
        weight_matrix: an ``rf_matrices`` name.
        num_features: rows ``s`` of the weight matrix.
        seed: layer ``i`` draws its weight matrix from ``seed + i``.
        name: the registered name, used in messages (default ``"rf-<component>-<matrix>"``;
            ``"rf-performer"`` for the alias).
        window: the sliding-window hybrid of [`rf_attention`][rf_attention.rf_attention] (causal layers):
            the last ``window`` positions by exact softmax weights, earlier ones by the features; the cache
            then keeps a ring of the last ``window`` keys and values beside the state. 0: none.
        softmax_layers: the layers (``layer_idx``) kept as softmax attention (``sdpa``): no map, a KV cache.
        **feature_options: more ``rf_features.create`` arguments (``kernel``, ``matrix_options``).
    """

    #: A [`RandomFeatureCache`][rf_attention.hf.RandomFeatureCache] keeps this attention's recurrent state.
    keeps_recurrent_state = True

    def __init__(
        self,
        component: str,
        weight_matrix: str,
        *,
        num_features: int = 128,
        seed: int = 0,
        name: str | None = None,
        window: int = 0,
        softmax_layers: Sequence[int] = (),
        **feature_options: Any,
    ) -> None:
        self.window = window
        self.softmax_layers = tuple(sorted({int(layer) for layer in softmax_layers}))
        self.component, self.weight_matrix = component, weight_matrix
        self.num_features, self.seed, self.feature_options = num_features, seed, feature_options
        self.name = name or f"{PREFIX}{component}-{weight_matrix}"

    @property
    def pair(self) -> str:
        """``"rf-<component>-<matrix>"`` (``"rf-performer"`` and ``"rf-posrf-orf"`` share maps)."""
        return f"{PREFIX}{self.component}-{self.weight_matrix}"

    @property
    def options(self) -> dict[str, Any]:
        """What a config records: ``num_features``, ``seed``, a window and the feature options."""
        extra: dict[str, Any] = {"window": self.window} if self.window else {}
        if self.softmax_layers:
            extra["softmax_layers"] = list(self.softmax_layers)
        return {"num_features": self.num_features, "seed": self.seed, **extra, **self.feature_options}

    def with_options(self, options: dict[str, Any]) -> HFRandomFeatureAttention:
        """This attention, or a copy with ``options`` (as `options` records them) in place of its own."""
        if options == self.options:
            return self
        merged = {**self.feature_options, **options}
        return HFRandomFeatureAttention(
            self.component,
            self.weight_matrix,
            num_features=merged.pop("num_features", self.num_features),
            seed=merged.pop("seed", self.seed),
            name=self.name,
            window=merged.pop("window", 0),
            softmax_layers=merged.pop("softmax_layers", ()),
            **merged,
        )

    def new_feature_map(
        self, module: nn.Module, head_dim: int, causal: bool, layer: int | None = None
    ) -> rf_features.FeatureMap:
        """A fresh map for the attention ``module`` (seeded ``seed + layer``, on its device), not attached.

        It remembers a checksum of its parameters as drawn (`changed_since_drawn`).
        """
        layer = getattr(module, "layer_idx", None) if layer is None else layer
        fm = rf_features.create(
            self.component,
            weight_matrix=self.weight_matrix,
            num_features=self.num_features,
            dim=head_dim,
            seed=self.seed + (layer or 0),
            statistics_mode="running" if causal else "batch",
            **self.feature_options,
            **(
                {"window_factor": True}
                if self.window and self.component.lower() in rf_features.LEARNED
                else {}
            ),
        )
        parameter = next(module.parameters(), None)
        fm.train(module.training)  # a map created during an eval() forward pass must not update statistics
        fm = fm.to(device=None if parameter is None else parameter.device)
        setattr(fm, "rf_drawn", _checksum(fm))  # noqa: B010 (nn.Module types attributes as Tensor | Module)
        return fm

    def attach(self, module: nn.Module, fm: rf_features.FeatureMap) -> rf_features.FeatureMap:
        """Make ``fm`` the attention ``module``'s map for this pair (``module.rf_feature_map``)."""
        module.rf_feature_map = fm
        setattr(module, WINDOW_ATTRIBUTE, self.window)
        setattr(module, "rf_attention_name", self.pair)  # noqa: B010 (nn.Module types attributes as Tensor | Module)
        return fm

    def keeps_softmax(self, layer: int) -> bool:
        """Whether layer ``layer`` stays softmax attention (``softmax_layers``)."""
        return layer in self.softmax_layers

    def keep_softmax(self, module: nn.Module) -> None:
        """Make the attention ``module`` run softmax attention (``sdpa``): its map, if any, is removed."""
        if hasattr(module, "rf_feature_map"):
            del module.rf_feature_map
        setattr(module, SOFTMAX_ATTRIBUTE, True)

    def feature_map(
        self,
        module: nn.Module,
        head_dim: int,
        causal: bool,
        layer: int | None = None,
        *,
        attaching: bool = False,
    ) -> rf_features.FeatureMap:
        """``module.rf_feature_map``, created (`new_feature_map`) and attached if missing or not this pair's.

        Raises:
            ValueError: the map is missing, the model was loaded from a folder whose safetensors hold
                trained maps, and this is not [`attach_feature_maps`][rf_attention.hf.attach_feature_maps]
                (a fresh map would silently replace the trained one).
        """
        current = getattr(module, "rf_feature_map", None)
        if current is not None and getattr(module, "rf_attention_name", None) == self.pair:
            return current
        saved = saved_feature_map_file(getattr(getattr(module, "config", None), "_name_or_path", None))
        if current is None and saved is not None and not attaching:
            raise ValueError(
                f"{self.name}: this model was loaded from {saved.parent}, whose {saved.name} holds trained "
                "rf_feature_map tensors that from_pretrained left out; call "
                "rf_attention.hf.attach_feature_maps(model) after loading (it restores them)"
            )
        return self.attach(module, self.new_feature_map(module, head_dim, causal, layer))

    def _check_window(self, window: int | None, length: int) -> None:
        """A sliding window is no restriction when it spans all ``length`` positions; refused otherwise."""
        if window is not None and window < length:
            raise ValueError(
                f"sliding_window: {self.name} attends to every earlier position, and this call spans "
                f"{length} positions, more than the model's window of {window}; set "
                "config.sliding_window=None (or at least the longest sequence) to run it as full causal "
                "attention"
            )

    def __call__(
        self,
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        """RF attention of ``query (B, H, N_q, Dh)`` over ``key, value (B, H_kv, N_k, Dh)``.

        Returns:
            ``(attn_output (B, N_q, H, Dh), None)``: there are no attention weights to return.
        """
        for option in _UNSUPPORTED:
            if kwargs.get(option) is not None:
                raise ValueError(f"{option}: not supported by {self.name} (got {kwargs[option]!r})")
        if dropout and module.training:
            warnings.warn(
                f"{self.name}: attention dropout ({dropout}) is not applied (random-feature attention forms "
                "no attention probabilities); set the model's attention dropout to 0",
                stacklevel=2,
            )
        if getattr(module, SOFTMAX_ATTRIBUTE, False):  # a layer the conversion kept (softmax_layers)
            return sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
            )
        causal = kwargs.get("is_causal")
        causal = getattr(module, "is_causal", True) if causal is None else bool(causal)
        window = int(getattr(module, WINDOW_ATTRIBUTE, self.window))
        if window and not causal:
            raise ValueError(f"window: {self.name}'s sliding window of {window} needs causal attention")
        if query.shape[1] % key.shape[1]:
            raise ValueError(
                f"key: expected a number of heads dividing the query's {query.shape[1]}, got {key.shape[1]}"
            )
        if kwargs.get(CACHE_LAYER_KWARG) is None:  # a model that does not pass its kwargs to cache.update
            kwargs[CACHE_LAYER_KWARG] = pending_cache_layer(key)
        groups = query.shape[1] // key.shape[1]
        if groups > 1:  # grouped-query attention: as HF's repeat_kv
            key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        fm = self.feature_map(module, query.shape[-1], causal)
        with statistics_where_saved(module, fm):
            return self._attend(
                module, fm, query, key, value, attention_mask, scaling, causal, window, kwargs
            )

    def _attend(
        self,
        module: nn.Module,
        fm: rf_features.FeatureMap,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float | None,
        causal: bool,
        window: int,
        kwargs: dict[str, Any],
    ) -> tuple[torch.Tensor, None]:
        """``__call__`` after the checks, grouped keys repeated, the feature map and the window found."""
        cache_layer = kwargs.get(CACHE_LAYER_KWARG)
        n_q, n_k = query.shape[-2], key.shape[-2]
        cu_seqlens = packed_cu_seqlens(kwargs, query.shape[0], n_q) if n_q == n_k else None
        packed = cu_seqlens is not None and mask_allows_packing(attention_mask, cu_seqlens, n_q, causal)
        seen = cache_layer.seen if isinstance(cache_layer, RecurrentCacheLayer) else 0
        self._check_window(kwargs.get("sliding_window"), seen + n_k)
        if isinstance(cache_layer, RecurrentCacheLayer):
            if packed:
                raise ValueError(
                    f"position_ids: packed sequences (restarting positions) cannot be decoded by "
                    f"{self.name}'s RandomFeatureCache (one state per row); run them with use_cache=False"
                )
            out = cache_layer.attend(
                self.name, query, key, value, fm, attention_mask, causal, scaling, window=window
            )
            return out.transpose(1, 2).contiguous(), None
        if packed:  # HF's block mask (no cache: it reads the restarting positions too) is the documents'
            padding = None
        else:
            if attention_mask is None and causal and 1 < n_q < n_k:
                key, value, n_k = key[..., :n_q, :], value[..., :n_q, :], n_q  # empty static-cache slots
            padding = key_padding_from_mask(attention_mask, n_q, n_k, causal)
            if causal and n_q < n_k:  # HF's DynamicCache: the first N_k - N_q keys come from the cache
                out = attend_after_cached_keys(
                    query, key, value, fm, window=window, key_padding_mask=padding, scale=scaling
                )
                return out.transpose(1, 2), None
        out = layer_attention(
            module,
            fm,
            query,
            key,
            value,
            causal=causal,
            key_padding_mask=padding,
            query_padding_mask=padding if n_q == n_k else None,
            cu_seqlens=cu_seqlens if packed else None,
            window=window,
            scale=scaling,
        )
        return out.transpose(1, 2).contiguous(), None


def _checksum(fm: nn.Module) -> tuple[float, ...]:
    """The sum and the sum of squares of each parameter of ``fm`` (float64): a fingerprint of its values."""
    with torch.no_grad():
        return tuple(
            float(total) for p in fm.parameters() for total in (p.double().sum(), p.double().square().sum())
        )


def changed_since_drawn(fm: nn.Module) -> bool:
    """Whether the parameters of a map made by `new_feature_map` changed since (trained, or loaded)."""
    drawn = getattr(fm, "rf_drawn", None)
    return drawn is not None and drawn != _checksum(fm)


def unknown_name(argument: str, name: str, names: list[str] | None = None) -> ValueError:
    """The error for an unknown ``rf-*`` attention ``name``: the closest names, then all.

    Args:
        argument: the argument that gave ``name``.
        name: as the user typed it (the names are listed with the ``rf-`` prefix if it has one).
        names: the known names (default: the registered ``rf-*`` attentions).
    """
    prefixed = name.startswith(PREFIX)
    bare = [n.removeprefix(PREFIX) for n in (_registered_names() if names is None else names)]
    known = sorted(f"{PREFIX}{n}" if prefixed else n for n in bare)
    closest = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    suggestion = f"; did you mean {' or '.join(repr(c) for c in closest)}?" if closest else ""
    return ValueError(
        f"{argument}: unknown random-feature attention {name!r}{suggestion} "
        f"(known: {', '.join(map(repr, known))})"
    )


def known(argument: str, name: str) -> HFRandomFeatureAttention:
    """The attention registered as ``name`` (``"posrf-orf"`` or ``"rf-posrf-orf"``).

    Raises:
        ValueError: an unknown name, with the closest known ones and the list (`unknown_name`).
    """
    function = registered(f"{PREFIX}{name.removeprefix(PREFIX)}")
    if function is None:
        raise unknown_name(argument, name)
    return function


def _registered_names() -> list[str]:
    return [n for n in ALL_ATTENTION_FUNCTIONS.valid_keys() if registered(n) is not None]


def _check_feature_options(
    pairs: dict[str, tuple[str, str]], num_features: int, options: dict[str, Any]
) -> None:
    """Build each pair's map once, small, so that a keyword it does not take fails now, not at loading."""
    for name, (component, matrix) in pairs.items():
        try:
            rf_features.create(
                component, weight_matrix=matrix, num_features=num_features, dim=16, seed=0, **options
            )
        except TypeError as error:
            raise ValueError(
                f"feature_options: {name} does not take {sorted(options)} ({error}); the keywords go to "
                "rf_features.create (kernel, matrix_options, learnable, num_heads, ...)"
            ) from error


def register(
    names: list[str] | None = None, *, num_features: int = 128, seed: int = 0, **feature_options: Any
) -> list[str]:
    """Register (or re-register with new options) ``"rf-<pair>"`` attentions with transformers.

    Every argument is checked first (each pair's map is built once with ``feature_options``): nothing is
    registered when one fails.

    Args:
        names: attention names such as ``"posrf-orf"`` or ``"rf-posrf-orf"``, or a learned map
            (``"hedgehog"``, ``"t2r"``); default: every pair, ``performer`` and the learned maps.
        num_features: rows ``s`` of each layer's weight matrix.
        seed: layer ``i`` draws from ``seed + i``.
        **feature_options: more ``rf_features.create`` arguments.

    Returns:
        The registered ``attn_implementation`` names.

    Raises:
        ValueError: an unknown name (with the closest known ones), ``num_features < 1``, a keyword the
            feature maps do not take.
    """
    check_int("num_features", num_features)
    check_int("seed", seed, minimum=None)
    pairs = {}
    every = [*attention_names(), "performer"]
    for name in names if names is not None else every:
        bare = name.removeprefix(PREFIX)
        pair = ("posrf", "orf") if bare == "performer" else feature_pair(bare)
        if pair is not None:
            pairs[f"{PREFIX}{bare}"] = pair
        elif names is not None:
            raise unknown_name("names", name, [n for n in every if n == "performer" or feature_pair(n)])
    if feature_options:
        _check_feature_options(pairs, num_features, feature_options)
    for key, pair in pairs.items():
        AttentionInterface.register(
            key,
            HFRandomFeatureAttention(
                *pair, num_features=num_features, seed=seed, name=key, **feature_options
            ),
        )
        AttentionMaskInterface.register(key, sdpa_mask)
    return list(pairs)


def registered(name: str | None) -> HFRandomFeatureAttention | None:
    """The ``rf-*`` attention registered under ``name``, or None for any other ``attn_implementation``."""
    function = ALL_ATTENTION_FUNCTIONS.get(name) if name else None
    return function if isinstance(function, HFRandomFeatureAttention) else None
