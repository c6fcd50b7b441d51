"""Random-feature attention inside Hugging Face transformers models (``attn_implementation="rf-..."``).

Importing this module registers, with ``transformers.AttentionInterface`` (and the matching mask
function with ``AttentionMaskInterface``), one attention per ``"<component>-<matrix>"`` pair of
[`rf_attention.names`][rf_attention.names] under the name ``"rf-<pair>"`` (``"rf-posrf-orf"``,
``"rf-oprf-fastfoodl"``, ...) and ``"rf-performer"``. Any model that dispatches its attention through the
interface (Llama, Mistral, Qwen2, GPT-2, ViT, ...) then runs it::

    import rf_attention.hf  # registers the names
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="rf-posrf-orf")
    rf_attention.hf.attach_feature_maps(model)  # before building the optimizer
    ...  # uptrain
    model.save_pretrained(out)  # the feature maps' tensors too
    model = AutoModelForCausalLM.from_pretrained(out, attn_implementation="rf-posrf-orf")
    rf_attention.hf.attach_feature_maps(model)  # restores the saved maps from `out`
    model.generate(...)  # O(1) per token: a RandomFeatureCache keeps each layer's recurrent state

The model keeps all of its weights (projections, norms, MLPs, embeddings); each attention layer gains a
feature map (the random weight matrix, learnable for ``fastfoodl``, OPRF/SADERF running statistics),
attached to the HF attention module as ``rf_feature_map``, seeded ``seed + layer_idx``. The HF module's
``q, k, v`` (after its rotary embedding) are combined by [`rf_attention`][rf_attention.rf_attention] with
HF's ``scaling``; grouped keys (GQA) are repeated; HF's 4D mask is read back into causality plus a key
padding mask (sliding windows and other patterns are refused). Packed sequences (one row, ``position_ids``
restarting at 0, as ``DataCollatorWithFlattening`` packs them; or its ``cu_seq_lens_q``) run through
``cu_seqlens``: each document attends to itself only.

During ``generate`` a [`RandomFeatureCache`][rf_attention.hf.RandomFeatureCache] (installed by
[`attach_feature_maps`][rf_attention.hf.attach_feature_maps]) keeps, per RF layer, the
[`RecurrentState`][rf_attention.ops.recurrent.RecurrentState] instead of the keys: O(1) time and memory per
token. Given HF's own ``DynamicCache``, the new queries attend to the cached keys through a state built
from them (O(N) per token).
"""

from __future__ import annotations

import types
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache, DynamicLayer
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

if TYPE_CHECKING:
    from transformers import PreTrainedModel

import rf_features
from rf_attention.decoding import RecurrentState, decode
from rf_attention.functional import rf_attention
from rf_attention.registry import names as attention_names
from rf_attention.registry import split_pair

#: Prefix of the names registered with ``transformers.AttentionInterface``.
PREFIX = "rf-"
#: Keyword arguments of HF attention calls that ask for something RF attention cannot do.
_UNSUPPORTED = ("sliding_window", "softcap", "s_aux", "position_bias")
#: The keyword a ``RecurrentCacheLayer`` adds to the attention call's ``kwargs`` (HF passes the same dict
#: to ``cache.update`` and then to the attention function).
CACHE_LAYER_KWARG = "rf_cache_layer"


class HFRandomFeatureAttention:
    """The function HF calls as ``attention_interface(module, query, key, value, attention_mask, ...)``.

    Args:
        component: an ``rf_features`` component name.
        weight_matrix: an ``rf_matrices`` name.
        num_features: rows ``s`` of the weight matrix.
        seed: layer ``i`` draws its weight matrix from ``seed + i``.
        name: the registered name, used in messages (default ``"rf-<component>-<matrix>"``;
            ``"rf-performer"`` for the alias).
        **feature_options: more ``rf_features.create`` arguments (``kernel``, ``matrix_options``).
    """

    def __init__(
        self,
        component: str,
        weight_matrix: str,
        *,
        num_features: int = 128,
        seed: int = 0,
        name: str | None = None,
        **feature_options: Any,
    ) -> None:
        self.component, self.weight_matrix = component, weight_matrix
        self.num_features, self.seed, self.feature_options = num_features, seed, feature_options
        self.name = name or f"{PREFIX}{component}-{weight_matrix}"

    def feature_map(
        self,
        module: nn.Module,
        head_dim: int,
        causal: bool,
        layer: int | None = None,
        *,
        attaching: bool = False,
    ) -> rf_features.FeatureMap:
        """``module.rf_feature_map``, created (seeded, on the module's device) if missing or not this one.

        Raises:
            ValueError: the map is missing, the model was loaded from a folder whose safetensors hold
                trained maps, and this is not [`attach_feature_maps`][rf_attention.hf.attach_feature_maps]
                (a fresh map would silently replace the trained one).
        """
        current = getattr(module, "rf_feature_map", None)
        pair = (
            f"{PREFIX}{self.component}-{self.weight_matrix}"  # "rf-performer" and "rf-posrf-orf" share maps
        )
        if current is not None and getattr(module, "rf_attention_name", None) == pair:
            return current
        saved = _saved_feature_map_file(getattr(getattr(module, "config", None), "_name_or_path", None))
        if current is None and saved is not None and not attaching:
            raise ValueError(
                f"{self.name}: this model was loaded from {saved.parent}, whose {saved.name} holds trained "
                "rf_feature_map tensors that from_pretrained left out; call "
                "rf_attention.hf.attach_feature_maps(model) after loading (it restores them)"
            )
        layer = getattr(module, "layer_idx", None) if layer is None else layer
        fm = rf_features.create(
            self.component,
            weight_matrix=self.weight_matrix,
            num_features=self.num_features,
            dim=head_dim,
            seed=self.seed + (layer or 0),
            statistics_mode="running" if causal else "batch",
            **self.feature_options,
        )
        parameter = next(module.parameters(), None)
        fm.train(module.training)  # a map created during an eval() forward pass must not update statistics
        module.rf_feature_map = fm.to(device=None if parameter is None else parameter.device)
        setattr(module, "rf_attention_name", pair)  # noqa: B010 (nn.Module types attributes as Tensor | Module)
        return module.rf_feature_map

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
        cache_layer = kwargs.get(CACHE_LAYER_KWARG)
        causal = kwargs.get("is_causal")
        causal = getattr(module, "is_causal", True) if causal is None else bool(causal)
        head_dim = query.shape[-1]
        if query.shape[1] % key.shape[1]:
            raise ValueError(
                f"key: expected a number of heads dividing the query's {query.shape[1]}, got {key.shape[1]}"
            )
        groups = query.shape[1] // key.shape[1]
        if groups > 1:  # grouped-query attention: as HF's repeat_kv
            key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        if scaling is not None:  # rf_attention scales q . k by Dh^-1/2 itself
            query = query * (scaling * head_dim**0.5)
        n_q, n_k = query.shape[-2], key.shape[-2]
        fm = self.feature_map(module, head_dim, causal)
        cu_seqlens = _packed_cu_seqlens(kwargs, query.shape[0], n_q) if n_q == n_k else None
        if cu_seqlens is not None and _mask_allows_packing(attention_mask, cu_seqlens, n_q, causal):
            if isinstance(cache_layer, RecurrentCacheLayer):
                raise ValueError(
                    f"position_ids: packed sequences (restarting positions) cannot be decoded by "
                    f"{self.name}'s RandomFeatureCache (one state per row); run them with use_cache=False"
                )
            out = rf_attention(query, key, value, fm, causal=causal, cu_seqlens=cu_seqlens)
            return out.transpose(1, 2).contiguous(), None
        if isinstance(cache_layer, RecurrentCacheLayer):
            out = cache_layer.attend(self.name, query, key, value, fm, attention_mask, causal)
            return out.transpose(1, 2).contiguous(), None
        if attention_mask is None and causal and 1 < n_q < n_k:
            key, value, n_k = key[..., :n_q, :], value[..., :n_q, :], n_q  # empty static-cache slots
        padding = key_padding_from_mask(attention_mask, n_q, n_k, causal)
        if not causal or n_q == n_k:
            query_padding = padding if n_q == n_k else None
            out = rf_attention(
                query,
                key,
                value,
                fm,
                causal=causal,
                key_padding_mask=padding,
                query_padding_mask=query_padding,
            )
        else:
            out = _attend_after_cached_keys(query, key, value, fm, padding)
        return out.transpose(1, 2).contiguous(), None


def _attend_after_cached_keys(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    fm: rf_features.FeatureMap,
    padding: torch.Tensor | None,
) -> torch.Tensor:
    """Causal RF attention of the last ``N_q`` positions, the first ``N_k - N_q`` keys coming from a cache."""
    prefix = k.shape[-2] - q.shape[-2]
    head, tail = (None, None) if padding is None else (padding[:, :prefix], padding[:, prefix:])
    cached = k[..., :prefix, :]  # the cached positions' queries are not needed: their keys stand in
    _, state = decode(cached, cached, v[..., :prefix, :], fm, None, key_padding_mask=head)
    out, _ = decode(q, k[..., prefix:, :], v[..., prefix:, :], fm, state, key_padding_mask=tail)
    return out


class RecurrentCacheLayer(CacheLayerMixin):  # type: ignore[no-untyped-call]
    """One RF attention layer's part of a [`RandomFeatureCache`][rf_attention.hf.RandomFeatureCache].

    Holds the layer's [`RecurrentState`][rf_attention.ops.recurrent.RecurrentState] (``(B, H, m, Dv)`` sums,
    the same size after any number of tokens) and the number of tokens seen, no keys. ``update`` returns
    the new keys and values unchanged and hands itself to the layer's attention function (through the
    ``kwargs`` HF passes to both), which runs the new tokens against the state and advances it.
    """

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.state: RecurrentState | None = None
        self.seen = 0
        self.pending = False

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Mark the layer initialized (the state is created by the first attention call)."""
        self.device = key_states.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the new ``key_states, value_states`` and register this layer in the attention's kwargs.

        Raises:
            ValueError: the model's attention module does not pass its kwargs to ``cache.update``, or the
                attention after the previous update was not an RF attention (it did not use the state).
        """
        attention_kwargs = kwargs.get("kwargs")
        if not isinstance(attention_kwargs, dict):
            raise ValueError(
                "cache: this model's attention does not pass its kwargs to cache.update, so a "
                "RandomFeatureCache cannot reach its attention function; generate with "
                "cache=transformers.DynamicCache(config=model.config) (O(N) per token)"
            )
        if self.pending:
            raise ValueError(
                "cache: the attention of a layer given a RecurrentCacheLayer is not an rf-* attention; build "
                "the cache with RandomFeatureCache(model), which gives such layers a DynamicLayer"
            )
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        attention_kwargs[CACHE_LAYER_KWARG] = self
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
    ) -> torch.Tensor:
        """Causal RF attention of ``T`` new tokens ``q, k, v (B, H, T, Dh)`` continuing the state."""
        self.pending = False
        if not causal:
            raise ValueError(f"{name}: a RandomFeatureCache serves causal (decoder) attention only")
        n = q.shape[-2]
        if k.shape[-2] != n:
            raise ValueError(f"key: expected the {n} new positions' keys, got {k.shape[-2]}")
        if attention_mask is not None and attention_mask.shape[-1] > n:
            # a mask sized for a softmax layer's keys (mixed models share one): the new keys are the last n
            attention_mask = attention_mask[..., -n:]
        padding = key_padding_from_mask(attention_mask, n, n, causal=True)
        out, self.state = decode(q, k, v, fm, self.state, key_padding_mask=padding)
        self.seen += n
        return out.to(v.dtype)

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
            rows = torch.arange(self.state.numerator.shape[0], device=self.state.numerator.device)
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


class RandomFeatureCache(Cache):
    """A transformers ``Cache`` that keeps each RF attention layer's recurrent state instead of its keys.

    Layers whose attention module runs a registered ``rf-*`` attention get a
    [`RecurrentCacheLayer`][rf_attention.hf.RecurrentCacheLayer] (O(1) per token); other layers (softmax
    attention in a mixed model) get HF's ``DynamicLayer``. ``generate`` builds one by itself after
    [`attach_feature_maps`][rf_attention.hf.attach_feature_maps]; pass ``cache=RandomFeatureCache(model)``
    to ``model(...)`` to decode in your own loop. Beam search reorders the states; rollbacks (``crop``,
    assisted generation) are refused.

    Args:
        model: the transformers model (its attention modules carry ``layer_idx``).
    """

    def __init__(self, model: PreTrainedModel) -> None:
        rf_layers: set[int] = set()
        for module in model.modules():
            config = getattr(module, "config", None)
            implementation = getattr(config, "_attn_implementation", None)
            function = AttentionInterface._global_mapping.get(implementation) if implementation else None
            layer = getattr(module, "layer_idx", None)
            if (
                isinstance(function, HFRandomFeatureAttention)
                and isinstance(layer, int)
                and _is_attention(module)
            ):
                rf_layers.add(layer)
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


def _is_attention(module: nn.Module) -> bool:
    """An HF attention module: a ``config``, a ``scaling`` and an integer ``head_dim``."""
    head_dim = getattr(module, "head_dim", None)
    return hasattr(module, "config") and hasattr(module, "scaling") and isinstance(head_dim, int)


def _packed_cu_seqlens(kwargs: dict[str, Any], batch: int, n: int) -> torch.Tensor | None:
    """``cu_seqlens`` of packed sequences in one row, from ``cu_seq_lens_q`` or restarting ``position_ids``.

    As HF's flash-attention path: a single row whose position ids restart (every position equal to the
    first one starts a sequence); None for anything else (one sequence, several rows, a decoding step).
    """
    given = kwargs.get("cu_seq_lens_q")
    if given is not None:
        if batch != 1:
            raise ValueError(f"cu_seq_lens_q: expected sequences packed into one row, got a batch of {batch}")
        return given if given.numel() > 2 else None
    positions = kwargs.get("position_ids")
    if positions is None or batch != 1 or n == 1 or positions.shape[-1] != n:
        return None
    positions = positions.reshape(-1)
    if bool(positions[0] != positions.min()):  # e.g. a left-padded prompt's positions: not packed
        return None
    starts = (positions == positions[0]).nonzero().view(-1)
    if starts.numel() < 2:
        return None
    end = torch.tensor([n], device=starts.device)
    return torch.cat([starts, end]).to(torch.int32)


def _mask_allows_packing(
    attention_mask: torch.Tensor | None, cu_seqlens: torch.Tensor, n: int, causal: bool
) -> bool:
    """Whether HF's mask is plain (causal or full, no padding) or blocks per packed sequence.

    A mask with padding means the restarting positions are padding's (a left-padded prompt's position ids
    restart at its first token), as HF's flash-attention path reads them: not packed documents.
    """
    if attention_mask is None:
        return True
    if attention_mask.dim() != 4 or tuple(attention_mask.shape[-2:]) != (n, n):
        return False
    allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
    allowed = allowed[0, 0]
    positions = torch.arange(n, device=allowed.device)
    plain = positions <= positions.unsqueeze(-1) if causal else torch.ones_like(allowed)
    sequence = torch.searchsorted(cu_seqlens[1:].to(positions.device).long(), positions, right=True)
    blocks = plain & (sequence == sequence.unsqueeze(-1))
    return torch.equal(allowed, plain) or torch.equal(allowed, blocks)


def key_padding_from_mask(
    attention_mask: torch.Tensor | None, n_q: int, n_k: int, causal: bool
) -> torch.Tensor | None:
    """HF's 4D mask ``(B, 1 or H, N_q, N_k)`` (bool, True = attend; or additive) as a key padding mask.

    The mask must be what causality (query ``i`` at position ``N_k - N_q + i``) and padded keys give;
    query rows that attend to nothing (padded queries) are not checked.

    Returns:
        bool ``(B, N_k)``, True at padded keys, or None where no key is padding.

    Raises:
        ValueError: another pattern (sliding window, packed sequences, per-head masks, additive biases).
    """
    if attention_mask is None:
        return None
    if attention_mask.dim() != 4 or tuple(attention_mask.shape[-2:]) != (n_q, n_k):
        raise ValueError(
            f"attention_mask: expected a 4D mask (B, 1, {n_q}, {n_k}), got {tuple(attention_mask.shape)}"
        )
    if attention_mask.dtype == torch.bool:
        allowed = attention_mask
    else:
        allowed = attention_mask > torch.finfo(attention_mask.dtype).min / 2
        if bool((attention_mask[allowed] != 0).any()):
            raise ValueError("attention_mask: additive biases other than 0 / -inf are not supported")
    if allowed.shape[1] != 1 and not bool((allowed == allowed[:, :1]).all()):
        raise ValueError("attention_mask: per-head masks are not supported")
    allowed = allowed[:, 0]  # (B, N_q, N_k)
    valid = allowed[:, -1, :] if causal else allowed.any(dim=-2)
    expected = valid.unsqueeze(-2).expand(-1, n_q, -1)
    if causal:
        positions = torch.arange(n_k, device=allowed.device)
        expected = expected & (positions <= positions[n_k - n_q :].unsqueeze(-1))
    rows_match = (allowed == expected).all(dim=-1) | ~allowed.any(dim=-1)
    if not bool(rows_match.all()):
        kind = "causal" if causal else "full"
        raise ValueError(
            f"attention_mask: RF attention supports {kind} attention with padded keys only; this mask has "
            "another pattern (sliding window, packed sequences with padding, or a static cache's offset?)"
        )
    return None if bool(valid.all()) else ~valid


def register(
    names: list[str] | None = None, *, num_features: int = 128, seed: int = 0, **feature_options: Any
) -> list[str]:
    """Register (or re-register with new options) ``"rf-<pair>"`` attentions with transformers.

    Args:
        names: attention names such as ``"posrf-orf"`` or ``"rf-posrf-orf"``; default: every pair and
            ``performer``.
        num_features: rows ``s`` of each layer's weight matrix.
        seed: layer ``i`` draws from ``seed + i``.
        **feature_options: more ``rf_features.create`` arguments.

    Returns:
        The registered ``attn_implementation`` names.
    """
    pairs = {}
    for name in names if names is not None else [*attention_names(), "performer"]:
        bare = name.removeprefix(PREFIX)
        pair = ("posrf", "orf") if bare == "performer" else split_pair(bare)
        if pair is not None:
            pairs[f"{PREFIX}{bare}"] = pair
        elif names is not None:
            raise ValueError(
                f"names: expected random-feature attention names such as 'posrf-orf', got {name!r}"
            )
    for key, pair in pairs.items():
        AttentionInterface.register(
            key,
            HFRandomFeatureAttention(
                *pair, num_features=num_features, seed=seed, name=key, **feature_options
            ),
        )
        AttentionMaskInterface.register(key, sdpa_mask)
    return list(pairs)


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
    function = AttentionInterface._global_mapping.get(name)
    if not isinstance(function, HFRandomFeatureAttention):
        raise ValueError(f"attn_implementation: expected a registered {PREFIX}* name, got {name!r}")
    count = 0
    for module in model.modules():
        if _is_attention(module):
            layer = getattr(module, "layer_idx", None)
            causal = bool(getattr(module, "is_causal", True))
            function.feature_map(
                module, module.head_dim, causal, count if layer is None else layer, attaching=True
            )
            count += 1
    # The weight matrices' generator states (for redraws, which this path never does) are not tensors:
    # save_pretrained (safetensors) keeps the maps' tensors and leaves those out.
    states = {k for k, v in model.state_dict().items() if ".rf_feature_map." in k and not torch.is_tensor(v)}
    model._keys_to_ignore_on_save = set(getattr(model, "_keys_to_ignore_on_save", None) or ()) | states
    saved = _saved_feature_map_file(getattr(model.config, "_name_or_path", None))
    if saved is not None:
        load_feature_maps(model, saved.parent)
    _use_random_feature_cache_in_generate(model)
    return count


def _use_random_feature_cache_in_generate(model: PreTrainedModel) -> None:
    """Bind ``_prepare_cache_for_generation`` (below) to ``model``, in place of the class's.

    A bound method of a module-level function: ``copy.deepcopy`` rebinds it to the copy, and pickling the
    model (``torch.save(model)``) keeps working.
    """
    if not isinstance(model.__dict__.get("_prepare_cache_for_generation"), types.MethodType):
        bound = types.MethodType(_prepare_cache_for_generation, model)
        setattr(model, "_prepare_cache_for_generation", bound)  # noqa: B010 (a method, per instance)


def _prepare_cache_for_generation(
    self: PreTrainedModel, generation_config: Any, model_kwargs: dict[str, Any], *args: Any, **kw: Any
) -> Any:
    """``generate``'s cache preparation, with a RandomFeatureCache where HF builds its DynamicCache."""
    prepare = type(self)._prepare_cache_for_generation  # type: ignore[attr-defined]  # GenerationMixin's
    result = prepare(self, generation_config, model_kwargs, *args, **kw)
    cache = model_kwargs.get("cache")
    if type(cache) is DynamicCache and not getattr(cache, "_is_user_defined", False):
        model_kwargs["cache"] = RandomFeatureCache(self)
    return result


def _saved_feature_map_file(path: str | None) -> Path | None:
    """The first ``*.safetensors`` file in the folder ``path`` with ``rf_feature_map`` tensors, or None."""
    if not path or not Path(path).is_dir():
        return None
    from safetensors import safe_open

    for file in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            if any(".rf_feature_map." in key for key in handle.keys()):  # noqa: SIM118 (not a dict)
                return file
    return None


def load_feature_maps(model: nn.Module, path: str | Path) -> int:
    """Load the feature maps that ``save_pretrained`` wrote into the folder ``path`` (after attaching).

    ``from_pretrained`` drops them (the model class has no such modules);
    [`attach_feature_maps`][rf_attention.hf.attach_feature_maps] calls this for the folder the model was
    loaded from. Call it yourself for maps saved elsewhere.

    Returns:
        The number of tensors loaded.
    """
    from safetensors.torch import load_file

    state = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        state.update({k: v for k, v in load_file(file).items() if ".rf_feature_map." in k})
    if not state:
        raise FileNotFoundError(f"path: no rf_feature_map tensors in the *.safetensors files of {path}")
    _, unexpected = model.load_state_dict(state, strict=False)
    if unexpected:
        raise ValueError(f"path: feature maps for modules this model lacks: {unexpected[:3]}")
    return len(state)


REGISTERED = register()
