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


@ACTIVATIONS.register("gelu_tanh")
def gelu_tanh(t: torch.Tensor) -> torch.Tensor:
    r"""GPT-2's GELU, $\frac t2 (1 + \tanh(\sqrt{2/\pi} (t + 0.044715 t^3)))$.

    As ``nn.GELU(approximate="tanh")``.
    """
    return F.gelu(t, approximate="tanh")


ACTIVATIONS.register("silu")(F.silu)
ACTIVATIONS.register("tanh")(torch.tanh)
ACTIVATIONS.register("sigmoid")(torch.sigmoid)
ACTIVATIONS.register("softsign")(F.softsign)
ACTIVATIONS.register("relu")(F.relu)


def activation_name(module_or_fn: object) -> str | None:
    """The registered name of an activation module or function, or None when it is not recognized.

    Guessed from the class or function name (``nn.GELU()``, ``F.silu``, HF's ``GELUActivation``...).
    The tanh form of GELU (``nn.GELU(approximate="tanh")``, HF's ``NewGELUActivation`` / ``gelu_new``,
    ``GELUTanh``, ``PytorchGELUTanh``, ``FastGELUActivation``) is ``"gelu_tanh"``, fitted as itself;
    ``QuickGELU`` (``t sigmoid(1.702 t)``) is not recognized.
    """
    raw = getattr(module_or_fn, "__name__", None) or type(module_or_fn).__name__
    name = raw.lower()
    if "gelu" in name:
        if "quick" in name:
            return None
        tanh_form = getattr(module_or_fn, "approximate", "none") == "tanh"
        if tanh_form or any(tag in name for tag in ("tanh", "new", "fast")):
            return "gelu_tanh"
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
