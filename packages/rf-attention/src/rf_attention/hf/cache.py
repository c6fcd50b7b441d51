"""The transformers ``Cache`` that keeps each RF layer's recurrent state (O(1) per token), not its keys."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache, DynamicLayer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import rf_features
from rf_attention.decoding import DecodingState, decode_heads
from rf_attention.hf.layers import SOFTMAX_ATTRIBUTE, is_attention_module
from rf_attention.hf.masks import key_padding_from_mask

if TYPE_CHECKING:
    from transformers import PreTrainedModel

#: The keyword a ``RecurrentCacheLayer`` adds to the attention call's ``kwargs`` (HF passes the same dict
#: to ``cache.update`` and then to the attention function).
CACHE_LAYER_KWARG = "rf_cache_layer"


#: The cache layer whose ``update`` ran last in this thread, with the keys it returned.
_PENDING = threading.local()


def pending_cache_layer(key: torch.Tensor) -> RecurrentCacheLayer | None:
    """The cache layer whose ``update`` returned ``key`` (this very tensor) in this thread, if any.

    The attention call that follows ``update`` receives the keys it returned: the tensor's identity ties
    the call to its layer, also for a model whose attention does not pass its kwargs to ``cache.update``.
    """
    entry = getattr(_PENDING, "entry", None)
    if entry is None or entry[1] is not key:
        return None
    _PENDING.entry = None
    return cast(RecurrentCacheLayer, entry[0])


class RecurrentCacheLayer(CacheLayerMixin):  # type: ignore[no-untyped-call]
    """One RF attention layer's part of a [`RandomFeatureCache`][rf_attention.hf.RandomFeatureCache].

    Holds the layer's decoding state, the object the modules' ``prefill`` and ``step`` keep (a
    [`RecurrentState`][rf_attention.ops.recurrent.RecurrentState]: ``(B, H, m, Dv)`` sums, the same size
    after any number of tokens; with a window a [`WindowState`][rf_attention.ops.window.WindowState]), and
    the number of tokens seen, no keys; [`decode_heads`][rf_attention.decoding.decode_heads], the modules'
    decoding, advances it. ``update`` returns
    the new keys and values unchanged and hands itself to the layer's attention function (through the
    ``kwargs`` HF passes to both), which runs the new tokens against the state and advances it.
    """

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.state: DecodingState | None = None
        self.seen = 0
        self.pending = False

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Mark the layer initialized (the state is created by the first attention call)."""
        self.device = key_states.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the new ``key_states, value_states`` and hand this layer to the attention function.

        Through the attention call's ``kwargs`` where the model passes them to ``cache.update`` (Llama,
        Qwen, ...), else (GPT-NeoX) through `pending_cache_layer`, which gives it to the call that receives
        these very ``key_states``.

        Raises:
            ValueError: the attention after the previous update was not an RF attention (it did not use
                the state).
        """
        if self.pending:
            raise ValueError(
                "cache: the attention of a layer given a RecurrentCacheLayer is not an rf-* attention; build "
                "the cache with RandomFeatureCache(model), which gives such layers a DynamicLayer"
            )
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        attention_kwargs = kwargs.get("kwargs")
        if isinstance(attention_kwargs, dict):
            attention_kwargs[CACHE_LAYER_KWARG] = self
        _PENDING.entry = (self, key_states)
        self.pending = True
        return key_states, value_states

    def attend(
        self,
        name: str,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        fm: rf_features.FeatureMap,
        attention_mask: torch.Tensor | None,
        causal: bool,
        scale: float | None,
        *,
        window: int = 0,
    ) -> torch.Tensor:
        """Causal RF attention of ``T`` new tokens ``q, k, v (B, H, T, Dh)`` continuing the state.

        [`decode_heads`][rf_attention.decoding.decode_heads] with the logit scale ``scale`` (HF's
        ``scaling``); with a ``window``, the hybrid's state: the feature sums and a ring of the last
        ``window`` keys and values. A state of the other kind (the window changed) is refused.
        """
        self.pending = False
        _PENDING.entry = None
        if not causal:
            raise ValueError(f"{name}: a RandomFeatureCache serves causal (decoder) attention only")
        n = q.shape[-2]
        if k.shape[-2] != n:
            raise ValueError(f"key: expected the {n} new positions' keys, got {k.shape[-2]}")
        if attention_mask is not None and attention_mask.shape[-1] > n:
            # a mask sized for a softmax layer's keys (mixed models share one): the new keys are the last n
            attention_mask = attention_mask[..., -n:]
        padding = key_padding_from_mask(attention_mask, n, n, causal=True)
        out, self.state = decode_heads(
            q, k, v, fm, self.state, window=window, key_padding_mask=padding, scale=scale
        )
        self.seen += n
        return out

    def get_seq_length(self) -> int:
        """Tokens seen (padding included): the position of the next token."""
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """``(query_length, tokens seen)``: the mask covers the new tokens only (the past is in the state)."""
        return query_length, self.seen

    def get_max_length(self) -> int:
        """-1: no maximum."""
        return -1

    def reset(self) -> None:
        """Forget every token."""
        self.state, self.seen, self.pending = None, 0, False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: keep the states of rows ``beam_idx``."""
        if self.state is not None:
            self.state = self.state.select(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep rows ``indices``."""
        self.reorder_cache(indices)  # type: ignore[arg-type]

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat each row ``repeats`` times."""
        if self.state is not None:
            rows = torch.arange(self.state.sums.shape[0], device=self.state.sums.device)
            self.state = self.state.select(rows.repeat_interleave(repeats))

    def crop(self, tokens_to_remove: int) -> None:
        """Refused: a recurrent state cannot forget its last tokens."""
        if tokens_to_remove:
            raise ValueError(
                f"tokens_to_remove: a RandomFeatureCache cannot drop tokens (got {tokens_to_remove}); "
                "assisted generation and other rollbacks need cache=transformers.DynamicCache(...)"
            )

    def offload(self) -> None:
        """Nothing to offload: the state is small."""

    def prefetch(self) -> None:
        """Nothing to prefetch."""


def keeps_recurrent_state(module: nn.Module) -> bool:
    """Whether ``module`` is an HF attention module whose ``attn_implementation`` keeps a recurrent state.

    That is: an attention module (a ``config``, a ``scaling`` and a head width) with an integer
    ``layer_idx``, and the function registered for its config's ``_attn_implementation`` has
    ``keeps_recurrent_state = True`` (the ``rf-*`` attentions), and the conversion did not keep it as softmax
    (``softmax_layers``).
    """
    if not (is_attention_module(module) and isinstance(getattr(module, "layer_idx", None), int)):
        return False
    if getattr(module, SOFTMAX_ATTRIBUTE, False):
        return False
    implementation = getattr(getattr(module, "config", None), "_attn_implementation", None)
    function = ALL_ATTENTION_FUNCTIONS.get(implementation) if implementation else None
    return bool(getattr(function, "keeps_recurrent_state", False))


class RandomFeatureCache(Cache):
    """A transformers ``Cache`` that keeps each RF attention layer's recurrent state instead of its keys.

    Layers whose attention module runs a registered ``rf-*`` attention get a
    [`RecurrentCacheLayer`][rf_attention.hf.RecurrentCacheLayer] (O(1) per token); other layers (softmax
    attention in a mixed model) get HF's ``DynamicLayer``. ``generate`` builds one by itself for a model
    with ``rf-*`` attention; pass ``cache=RandomFeatureCache(model)`` to ``model(...)`` to decode in your
    own loop. Beam search reorders the states; rollbacks (``crop``, assisted generation) are refused.

    Args:
        model: the transformers model (its attention modules carry ``layer_idx``).
    """

    def __init__(self, model: PreTrainedModel) -> None:
        modules = [module for module in model.modules() if keeps_recurrent_state(module)]
        rf_layers = {cast(int, module.layer_idx) for module in modules}
        if not rf_layers:
            raise ValueError(
                "model: no attention module runs a registered rf-* attention (attn_implementation), so a "
                "RandomFeatureCache has nothing to keep"
            )
        text_config = model.config.get_text_config(decoder=True)
        count: int = getattr(text_config, "num_hidden_layers", None) or max(rf_layers) + 1
        layers: list[Any] = [
            RecurrentCacheLayer() if i in rf_layers else DynamicLayer()  # type: ignore[no-untyped-call]
            for i in range(count)
        ]
        super().__init__(layers=layers)


def use_random_feature_cache_in_generate(model: PreTrainedModel) -> None:
    """Make ``model.generate`` build a RandomFeatureCache where it would build HF's ``DynamicCache``.

    transformers picks the cache of ``generate`` in ``_prepare_cache_for_generation`` and offers no public
    way to name another cache class (``generation_config.cache_implementation`` takes built-in names only),
    so this model alone (not its class) gets an attribute of that name: a
    [`RandomFeatureCachePreparation`][rf_attention.hf.cache.RandomFeatureCachePreparation], which runs the
    class's method and swaps the cache. It is an object, not a bound method, so that ``copy.deepcopy``
    and pickling (``torch.save(model)``) keep it.
    """
    if not isinstance(model.__dict__.get("_prepare_cache_for_generation"), RandomFeatureCachePreparation):
        preparation = RandomFeatureCachePreparation(model)
        setattr(model, "_prepare_cache_for_generation", preparation)  # noqa: B010 (per instance)


class RandomFeatureCachePreparation:
    """``generate``'s cache preparation for ``model``, with a RandomFeatureCache where HF builds its own.

    A cache the caller passes (``cache=...``) is kept, as are the other cache implementations.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model

    def __call__(self, generation_config: Any, model_kwargs: dict[str, Any], *args: Any, **kw: Any) -> Any:
        """Run the class's ``_prepare_cache_for_generation``, then replace a fresh ``DynamicCache``."""
        model = self.model
        prepare = type(model)._prepare_cache_for_generation  # type: ignore[attr-defined]  # GenerationMixin's
        result = prepare(model, generation_config, model_kwargs, *args, **kw)
        cache = model_kwargs.get("cache")
        if type(cache) is DynamicCache and not getattr(cache, "_is_user_defined", False):
            model_kwargs["cache"] = RandomFeatureCache(model)
        return result
