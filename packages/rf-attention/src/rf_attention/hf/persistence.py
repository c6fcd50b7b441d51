"""Saving and loading the feature maps of an HF model (``from_pretrained`` leaves them out).

The maps are submodules ``rf_feature_map`` of the attention modules, so ``save_pretrained`` writes their
tensors (weight matrix, learned scales, running statistics) into the model's safetensors beside the
pretrained weights. ``from_pretrained`` builds the model class, which has no such modules, and leaves those
tensors out: [`load_feature_maps`][rf_attention.hf.load_feature_maps] puts them back.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

#: The part of every state-dict key that belongs to a feature map.
FEATURE_MAP_KEY = ".rf_feature_map."


def saved_feature_map_file(path: str | Path | None) -> Path | None:
    """The first ``*.safetensors`` file in the folder ``path`` with ``rf_feature_map`` tensors, or None."""
    if not path or not Path(path).is_dir():
        return None
    for file in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            if any(FEATURE_MAP_KEY in key for key in handle.keys()):  # noqa: SIM118 (not a dict)
                return file
    return None


def load_feature_maps(model: nn.Module, path: str | Path, *, modules: Sequence[str] | None = None) -> int:
    """Load the feature maps that ``save_pretrained`` wrote into the folder ``path`` (after attaching).

    ``from_pretrained`` drops them (the model class has no such modules); attaching the maps
    ([`attach_feature_maps`][rf_attention.hf.attach_feature_maps], which ``from_pretrained`` runs for an
    ``rf-*`` attention) calls this for the folder the model was loaded from. Call it yourself for maps
    saved elsewhere.

    Returns:
        The number of tensors loaded.
    """
    state = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        state.update({k: v for k, v in load_file(file).items() if FEATURE_MAP_KEY in k})
    if modules is not None:
        state = {k: v for k, v in state.items() if k.startswith(tuple(modules))}
    if not state:
        raise FileNotFoundError(f"path: no rf_feature_map tensors in the *.safetensors files of {path}")
    _, unexpected = model.load_state_dict(state, strict=False)
    if unexpected:
        raise ValueError(f"path: feature maps for modules this model lacks: {unexpected[:3]}")
    return len(state)


def leave_out_non_tensor_state(model: nn.Module) -> None:
    """Add the feature maps' non-tensor state-dict entries to ``model._keys_to_ignore_on_save``.

    The weight matrices' generator states (for redraws, which this path never does) are ``_extra_state``
    dicts: safetensors holds tensors only, and ``save_pretrained`` would fail on them.
    """
    states = {k for k, v in model.state_dict().items() if FEATURE_MAP_KEY in k and not torch.is_tensor(v)}
    ignored = set(getattr(model, "_keys_to_ignore_on_save", None) or ())
    setattr(model, "_keys_to_ignore_on_save", ignored | states)  # noqa: B010 (nn.Module types attributes)
