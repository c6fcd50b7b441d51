"""The attention modules of an HF model that an ``rf-*`` attention runs in, and their head width."""

from __future__ import annotations

import inspect
import sys
from typing import Any

from torch import nn


def head_dim_of(module: nn.Module) -> int | None:
    """The head width of an HF attention module, or None for another module.

    The module's ``head_dim`` (Llama, GPT-2, Qwen, ...) or ``head_size`` (GPT-NeoX); else its config's
    ``head_dim`` or ``head_size``, else ``hidden_size // num_attention_heads``.
    """
    config: Any = getattr(module, "config", None)
    sources = (module, config)
    for source, attribute in ((s, a) for s in sources for a in ("head_dim", "head_size")):
        value = getattr(source, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    hidden, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", None)
    return hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None


#: The attribute of an HF attention module that a conversion kept as softmax attention (``softmax_layers``).
SOFTMAX_ATTRIBUTE = "rf_softmax"


def is_attention_module(module: nn.Module) -> bool:
    """An HF attention module: a ``config``, a ``scaling`` and a head width (`head_dim_of`)."""
    return hasattr(module, "config") and hasattr(module, "scaling") and head_dim_of(module) is not None


def check_dispatches_through_interface(model: nn.Module | type[nn.Module], *, switch: bool = False) -> None:
    """Refuse a model (or class) whose attention does not call ``AttentionInterface`` (Falcon, ...).

    As transformers decides whether ``set_attn_implementation`` can switch a class: its
    ``_can_set_attn_implementation`` reads the modeling source for the interface's call (the public
    ``_supports_attention_backend`` flag is unset on many classes that do call it: BART, BioGPT, ...).
    A class whose source cannot be read (defined in a notebook) is refused only for a ``switch``, which
    transformers then refuses too; built with an ``rf-*`` name it may still run it.

    Raises:
        ValueError: naming the class and the reason.
    """
    cls = model if isinstance(model, type) else type(model)
    can_set = getattr(cls, "_can_set_attn_implementation", None)
    if not callable(can_set) or can_set() or not (switch or _source_readable(cls)):
        return
    raise ValueError(
        f"model: {cls.__name__} computes its attention itself instead of calling the function registered "
        "with transformers.AttentionInterface (transformers finds no such call in its modeling code), so "
        "an rf-* attention cannot run in it; models such as Llama, Mistral, Qwen2/3, GPT-2, GPT-NeoX, "
        "BioGPT and ViT can be converted"
    )


def _source_readable(cls: type) -> bool:
    """Whether the source of the module defining ``cls`` can be read (not a notebook's class)."""
    try:
        inspect.getsource(sys.modules[cls.__module__])
    except (KeyError, OSError, TypeError):
        return False
    return True
