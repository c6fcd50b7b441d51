"""Seeding and the random state that a checkpoint must carry for a resumed run to match an unbroken one.

numpy's legacy global generator is seeded and saved on purpose (``noqa: NPY002``): it is the one that
third-party data code calls implicitly; our own code draws from explicit ``torch.Generator`` objects.
"""

from __future__ import annotations

import random
from typing import Any, cast

import numpy as np
import torch
from numpy.typing import NDArray

from spectraformer_core import check_int

#: Seed of the fixed training batch that calibrates replaced MLPs (``ralimp.replace_mlp(inputs=...)``) in
#: every app that replaces them (vit-finetune, gpt-uptrain).
CALIBRATION_SEED = 31_415_926


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, numpy's global generator and torch (CPU and every CUDA device)."""
    check_int("seed", seed, minimum=0)
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """The global random states (Python, numpy, torch CPU, torch CUDA) as plain lists and tensors.

    The result holds only types that ``torch.load(..., weights_only=True)`` reads back.
    """
    version, internal, gauss = random.getstate()
    # numpy's stub types the legacy (default) state as a tuple or a dict; at run time it is always the tuple
    legacy = cast("tuple[str, NDArray[np.uint32], int, int, float]", np.random.get_state())  # noqa: NPY002
    kind, keys, pos, has_gauss, cached = legacy
    return {
        "python": [version, list(internal), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the random states saved by [`rng_state`][app_common.seeding.rng_state]."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))  # noqa: NPY002
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
