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
    rf_attention.hf.attach_feature_maps(model)
    rf_attention.hf.load_feature_maps(model, out)

The model keeps all of its weights (projections, norms, MLPs, embeddings); each attention layer gains a
feature map (the random weight matrix, learnable for ``fastfoodl``, OPRF/SADERF running statistics),
attached to the HF attention module as ``rf_feature_map``, seeded ``seed + layer_idx``. The HF module's
``q, k, v`` (after its rotary embedding, with its KV cache) are combined by
[`rf_attention`][rf_attention.rf_attention] with HF's ``scaling``; grouped keys (GQA) are repeated; HF's
4D mask is read back into causality plus a key padding mask (other patterns, such as sliding windows or
packed sequences, are refused). During ``generate`` the new queries attend to the cached keys through a
[`RecurrentState`][rf_attention.decoding.RecurrentState] built from them: O(N) per token, since HF's
cache holds keys, not the recurrent state; ``step`` of the rf_attention modules is O(1).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

if TYPE_CHECKING:
    from transformers import PreTrainedModel

import rf_features
from rf_attention.decoding import RecurrentState, accumulate_keys, recurrent_attention
from rf_attention.functional import _accumulation_dtype, rf_attention
from rf_attention.registry import names as attention_names
from rf_attention.registry import split_pair

#: Prefix of the names registered with ``transformers.AttentionInterface``.
PREFIX = "rf-"
#: Keyword arguments of HF attention calls that ask for something RF attention cannot do.
_UNSUPPORTED = ("sliding_window", "softcap", "s_aux", "position_bias")


class HFRandomFeatureAttention:
    """The function HF calls as ``attention_interface(module, query, key, value, attention_mask, ...)``.

    Args:
        component: an ``rf_features`` component name.
        weight_matrix: an ``rf_matrices`` name.
        num_features: rows ``s`` of the weight matrix.
        seed: layer ``i`` draws its weight matrix from ``seed + i``.
        **feature_options: more ``rf_features.create`` arguments (``kernel``, ``matrix_options``).
    """

    def __init__(
        self,
        component: str,
        weight_matrix: str,
        *,
        num_features: int = 128,
        seed: int = 0,
        **feature_options: Any,
    ) -> None:
        self.component, self.weight_matrix = component, weight_matrix
        self.num_features, self.seed, self.feature_options = num_features, seed, feature_options

    @property
    def name(self) -> str:
        """The registered name, ``"rf-<component>-<matrix>"``."""
        return f"{PREFIX}{self.component}-{self.weight_matrix}"

    def feature_map(
        self, module: nn.Module, head_dim: int, causal: bool, layer: int | None = None
    ) -> rf_features.FeatureMap:
        """``module.rf_feature_map``, created (seeded, on the module's device) if missing or not this one."""
        current = getattr(module, "rf_feature_map", None)
        if current is not None and getattr(module, "rf_attention_name", None) == self.name:
            return current
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
        setattr(module, "rf_attention_name", self.name)  # noqa: B010 (nn.Module types attributes as Tensor | Module)
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
        if attention_mask is None and causal and 1 < n_q < n_k:
            key, value, n_k = key[..., :n_q, :], value[..., :n_q, :], n_q  # empty static-cache slots
        padding = key_padding_from_mask(attention_mask, n_q, n_k, causal)
        fm = self.feature_map(module, head_dim, causal)
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
    acc = _accumulation_dtype(q, k, v)
    scale = q.shape[-1] ** -0.25
    query_padding = None if padding is None else padding[:, prefix:]
    phi_q, phi_k, log_scale = fm.forward_with_key_scales(
        q.to(acc) * scale, k.to(acc) * scale, key_padding_mask=padding, query_padding_mask=query_padding
    )
    state = RecurrentState.empty(q.shape[:2], phi_k.shape[-1], v.shape[-1], dtype=acc, device=q.device)
    state = accumulate_keys(
        state, phi_k[..., :prefix, :], log_scale[..., :prefix], v[..., :prefix, :].to(acc)
    )
    out, _ = recurrent_attention(
        state, phi_q, phi_k[..., prefix:, :], log_scale[..., prefix:], v[..., prefix:, :]
    )
    return out.to(v.dtype)


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
            "another pattern (sliding window, packed sequences or a static cache's offset?)"
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
            key, HFRandomFeatureAttention(*pair, num_features=num_features, seed=seed, **feature_options)
        )
        AttentionMaskInterface.register(key, sdpa_mask)
    return list(pairs)


def attach_feature_maps(model: PreTrainedModel, attn_implementation: str | None = None) -> int:
    """Create every attention layer's feature map now (seeded ``seed + layer index``), on its device.

    Call it after loading and before building the optimizer, so that learnable weight matrices
    (``fastfoodl``) are trained; otherwise each map is created at the layer's first forward pass.

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
        head_dim = getattr(module, "head_dim", None)
        if hasattr(module, "config") and hasattr(module, "scaling") and isinstance(head_dim, int):
            layer = getattr(module, "layer_idx", None)
            causal = bool(getattr(module, "is_causal", True))
            function.feature_map(module, head_dim, causal, count if layer is None else layer)
            count += 1
    # The weight matrices' generator states (for redraws, which this path never does) are not tensors:
    # save_pretrained (safetensors) keeps the maps' tensors and leaves those out.
    states = {k for k, v in model.state_dict().items() if ".rf_feature_map." in k and not torch.is_tensor(v)}
    model._keys_to_ignore_on_save = set(getattr(model, "_keys_to_ignore_on_save", None) or ()) | states
    return count


def load_feature_maps(model: nn.Module, path: str | Path) -> int:
    """Load the feature maps that ``save_pretrained`` wrote into the folder ``path`` (after attaching).

    ``from_pretrained`` drops them (the model class has no such modules); call
    [`attach_feature_maps`][rf_attention.hf.attach_feature_maps] first, then this.

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
