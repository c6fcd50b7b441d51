"""The registry of component functions: `create`, `names`, `register`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rf_features.feature_map import FeatureMap
from rf_matrices import WeightMatrix
from spectraformer_core import Registry

COMPONENTS: Registry[type[FeatureMap]] = Registry("component function")


def register(name: str, *, override: bool = False) -> Callable[[type[FeatureMap]], type[FeatureMap]]:
    """Class decorator adding a [`FeatureMap`][rf_features.FeatureMap] subclass under ``name``."""
    return COMPONENTS.register(name, override=override)


def names(pattern: str | None = None) -> list[str]:
    """Registered component function names, optionally filtered by a shell pattern (``"pos*"``)."""
    return COMPONENTS.names(pattern)


def create(
    name: str | type[FeatureMap],
    *,
    weight_matrix: str | WeightMatrix = "orf",
    num_features: int = 128,
    dim: int,
    seed: int | None = None,
    **kw: Any,
) -> FeatureMap:
    """The feature map of component function ``name`` (or the class) over ``weight_matrix``.

    Examples:
        >>> fm = create("oprf", weight_matrix="sgq", num_features=128, dim=32, seed=0)

    Extra keyword arguments go to the class: ``kernel``, ``matrix_options``, and GERF's ``a`` and ``s``.
    """
    cls = COMPONENTS.get(name)
    return cls(dim, weight_matrix=weight_matrix, num_features=num_features, seed=seed, **kw)
