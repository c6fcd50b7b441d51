"""Random-feature attention inside Hugging Face transformers models (``attn_implementation="rf-..."``).

Importing this package registers, with ``transformers.AttentionInterface`` (and the matching mask
function with ``AttentionMaskInterface``), one attention per ``"<component>-<matrix>"`` pair of
[`rf_attention.names`][rf_attention.names] under the name ``"rf-<pair>"`` (``"rf-posrf-orf"``,
``"rf-oprf-fastfoodl"``, ...) and ``"rf-performer"``. Any model that dispatches its attention through the
interface (Llama, Mistral, Qwen2, Qwen3, GPT-2, GPT-NeoX, ViT, ...) then runs it::

    import rf_attention.hf  # registers the names
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="rf-posrf-orf")
    ...  # uptrain: the feature maps are submodules already, learnable ones train
    model.save_pretrained(out)  # the feature maps' tensors, the name and options in the config
    model = AutoModelForCausalLM.from_pretrained(out)  # the RF model again, its maps restored
    model.generate(...)  # O(1) per token: a RandomFeatureCache keeps each layer's recurrent state

    rf_attention.hf.linearize(softmax_model, "posrf-orf")  # or convert a loaded model in place

The model keeps all of its weights (projections, norms, MLPs, embeddings); each attention layer gains a
feature map (the random weight matrix, learnable for ``fastfoodl`` or a converted model, OPRF/SADERF
running statistics), attached to the HF attention module as ``rf_feature_map``, seeded ``seed +
layer_idx``, when the model is built, loaded or switched to an ``rf-*`` name (see
[`attach_feature_maps`][rf_attention.hf.attach_feature_maps]: transformers has no public hook there, so the
import wraps ``PreTrainedModel.post_init``, ``from_pretrained``, ``set_attn_implementation`` and the name
check ``_check_and_adjust_attn_implementation``, which change nothing for a model without an ``rf-*``
attention). The attention function is a thin adapter over the modules' core: the HF module's ``q, k, v``
(after its rotary embedding) go to [`layer_attention`][rf_attention.modules.layer_attention] with HF's
``scaling`` as the logit scale ``scale`` (``sqrt(scaling)`` on each of ``q`` and ``k``, as everywhere);
grouped keys (GQA) are repeated; HF's 4D mask is read back into causality plus a key padding mask (a
sliding window shorter than the sequence and other patterns are refused). Packed sequences (one row,
``position_ids`` restarting at 0, as ``DataCollatorWithFlattening`` packs them; or its ``cu_seq_lens_q``,
the only sign read under ``torch.compile``) run through ``cu_seqlens``: each document attends to itself
only.

During ``generate`` a [`RandomFeatureCache`][rf_attention.hf.RandomFeatureCache] keeps, per RF layer, the
modules' decoding state ([`RecurrentState`][rf_attention.ops.recurrent.RecurrentState], with a window a
[`WindowState`][rf_attention.ops.window.WindowState]) instead of the keys, advanced by the modules'
[`decode_heads`][rf_attention.decoding.decode_heads]: O(1) time and memory per token. Given HF's own
``DynamicCache``, the new queries attend to the cached keys through a state built from them
([`attend_after_cached_keys`][rf_attention.decoding.attend_after_cached_keys], O(N) per token).

The parts: ``attention`` (the function HF calls, registration), ``masks`` (HF's masks read back, packed
``cu_seqlens``), ``cache`` (the cache and its layer), ``persistence`` (saving and loading the maps),
``statistics`` (when running statistics move), ``layers`` (which modules are attention modules, their
head width), ``attach`` (maps on a model from its creation) and ``convert``
([`linearize`][rf_attention.hf.linearize]).
"""

from rf_attention.hf.attach import attach_feature_maps, install
from rf_attention.hf.attention import PREFIX, HFRandomFeatureAttention, register, registered
from rf_attention.hf.cache import CACHE_LAYER_KWARG, RandomFeatureCache, RecurrentCacheLayer
from rf_attention.hf.convert import linearize
from rf_attention.hf.masks import key_padding_from_mask
from rf_attention.hf.persistence import load_feature_maps

__all__ = [
    "CACHE_LAYER_KWARG",
    "PREFIX",
    "REGISTERED",
    "HFRandomFeatureAttention",
    "RandomFeatureCache",
    "RecurrentCacheLayer",
    "attach_feature_maps",
    "key_padding_from_mask",
    "linearize",
    "load_feature_maps",
    "register",
    "registered",
]

#: The ``attn_implementation`` names registered at import.
REGISTERED = register()
install()
