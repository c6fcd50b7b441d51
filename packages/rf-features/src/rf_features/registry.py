"""The registries of component functions and learned maps: `create`, `names`, `learned_names`, `register`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rf_features.feature_map import FeatureMap
from rf_features.learned import HedgehogFeatureMap, T2RFeatureMap
from rf_matrices import WeightMatrix
from spectraformer_core import Registry

COMPONENTS: Registry[type[FeatureMap]] = Registry("component function")
#: Learned feature maps (baselines whose kernel is learned, not estimated): kept apart from `COMPONENTS`,
#: so that they pair with no weight matrix and `names` lists random features only.
LEARNED: Registry[type[FeatureMap]] = Registry("learned feature map")
LEARNED.register("hedgehog")(HedgehogFeatureMap)
LEARNED.register("t2r")(T2RFeatureMap)


def register(name: str, *, override: bool = False) -> Callable[[type[FeatureMap]], type[FeatureMap]]:
    """Class decorator adding a [`FeatureMap`][rf_features.FeatureMap] subclass under ``name``."""
    return COMPONENTS.register(name, override=override)


def names(pattern: str | None = None) -> list[str]:
    """Registered component function names, optionally filtered by a shell pattern (``"pos*"``)."""
    return COMPONENTS.names(pattern)


def learned_names(pattern: str | None = None) -> list[str]:
    """Registered learned feature maps (``"hedgehog"``, ``"t2r"``; see `rf_features.learned`)."""
    return LEARNED.names(pattern)


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

    ``name`` may also be a learned map of `learned_names` (``weight_matrix`` then initializes its
    projection).

    Examples:
        >>> fm = create("oprf", weight_matrix="sgq", num_features=128, dim=32, seed=0)

    Extra keyword arguments go to the class: ``kernel``, ``matrix_options``, and GERF's ``a`` and ``s``.
    """
    cls = LEARNED.get(name) if isinstance(name, str) and name.lower() in LEARNED else COMPONENTS.get(name)
    return cls(dim, weight_matrix=weight_matrix, num_features=num_features, seed=seed, **kw)
