"""The activations RaLiMP layers approximate, as a registry of elementwise torch functions."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from spectraformer_core import Registry

Activation = Callable[[torch.Tensor], torch.Tensor]

#: Activation name -> elementwise function; ``ralimp.ACTIVATIONS.register("name")(fn)`` adds one.
ACTIVATIONS: Registry[Activation] = Registry("activation")

ACTIVATIONS.register("gelu")(F.gelu)
ACTIVATIONS.register("silu")(F.silu)
ACTIVATIONS.register("tanh")(torch.tanh)
ACTIVATIONS.register("sigmoid")(torch.sigmoid)
ACTIVATIONS.register("softsign")(F.softsign)
ACTIVATIONS.register("relu")(F.relu)


def activation_name(module_or_fn: object) -> str | None:
    """The registered name of an activation module or function, or None when it is not recognized.

    Guessed from the class or function name (``nn.GELU()``, ``F.silu``, HF's ``GELUActivation``...).

    ``nn.GELU(approximate="tanh")`` and HF's ``gelu_new`` map to ``"gelu"`` (they differ by < 1e-3).
    """
    raw = getattr(module_or_fn, "__name__", None) or type(module_or_fn).__name__
    name = raw.lower()
    for key, aliases in (
        ("softsign", ("softsign",)),
        ("silu", ("silu", "swish")),
        ("gelu", ("gelu",)),
        ("relu", ("relu",)),
        ("tanh", ("tanh",)),
        ("sigmoid", ("sigmoid",)),
    ):
        if any(alias in name for alias in aliases) and key in ACTIVATIONS:
            return key
    return None
