"""The registry of weight matrices: `create`, `names`, `register`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rf_matrices.drawn import DrawnMatrix
from rf_matrices.weight_matrix import WeightMatrix
from spectraformer_core import Registry

WEIGHT_MATRICES: Registry[type[WeightMatrix]] = Registry("weight matrix")


def register(name: str, *, override: bool = False) -> Callable[[type[WeightMatrix]], type[WeightMatrix]]:
    """Class decorator adding a [`WeightMatrix`][rf_matrices.WeightMatrix] subclass under ``name``.

    Examples:
        >>> @register("rademacher")
        ... class Rademacher(DenseWeightMatrix): ...
    """
    return WEIGHT_MATRICES.register(name, override=override)


def names(pattern: str | None = None) -> list[str]:
    """Registered weight matrix names, optionally filtered by a shell pattern such as ``"fast*"``."""
    return WEIGHT_MATRICES.names(pattern)


def create(
    name: str | type[WeightMatrix],
    num_features: int,
    dim: int,
    *,
    sigma: float = 1.0,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    even_in_omega: bool | None = None,
    learnable: bool = False,
    num_heads: int | None = None,
    **kw: Any,
) -> WeightMatrix:
    """Build the weight matrix registered as ``name`` (or the class itself), ``(num_features, dim)``.

    Extra keyword arguments go to the class (e.g. ``learn_gb=True`` for ``fastfoodl``). ``even_in_omega``
    says whether the estimates the rows serve are even in omega (TrigRF's cosine: True; PosRF's or a complex
    exponential's ``exp(omega . x)``: False): a rule with a folded form picks it from this
    ([`WeightMatrix.symmetry_options`][rf_matrices.WeightMatrix.symmetry_options]); None keeps the
    class defaults.

    ``learnable=True`` makes the drawn ``W`` one trainable parameter, and ``num_heads=H`` draws ``H``
    independent matrices ``(H, s, d)`` for inputs ``(..., H, n, d)``: both give a
    [`DrawnMatrix`][rf_matrices.DrawnMatrix] (structured matrices then become their dense ``W``; learned
    matrices are never redrawn).
    """
    cls = WEIGHT_MATRICES.get(name)
    if even_in_omega is not None:
        kw = cls.symmetry_options(even_in_omega, kw)
    common: dict[str, Any] = {"sigma": sigma, "seed": seed, "generator": generator, "device": device}
    if not (learnable or num_heads is not None):
        return cls(num_features, dim, dtype=dtype, **common, **kw)
    if not (learnable or cls.redrawable):
        raise ValueError(
            f"learnable: {cls.__name__} is learned by construction; per-head copies of it need learnable=True"
        )
    return DrawnMatrix(
        cls, num_features, dim, learnable=learnable, num_heads=num_heads, dtype=dtype, **common, **kw
    )
