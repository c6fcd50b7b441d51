"""The attention registry: explicit entries plus every ``"<component>-<matrix>"`` pair."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from torch import nn

import rf_features
import rf_matrices
from rf_attention.modules import MultiheadSelfAttention, RandomFeatureAttention, SoftmaxAttention
from spectraformer_core import Registry

#: Attentions registered by name (``softmax``, ``performer``, the baselines, users' own). The
#: ``"<component>-<matrix>"`` names are not stored: they follow the two registries they combine.
#: An attention factory: ``factory(dim, num_heads, **kw) -> module``.
AttentionFactory = Callable[..., nn.Module]

ATTENTIONS: Registry[AttentionFactory] = Registry("attention")

#: The weight matrix whose seeded draw starts a learned map's projection (``hedgehog``: the rows past the
#: identity; ``t2r``: all of them).
LEARNED_MAP_MATRIX = "orf"


def register(name: str, *, override: bool = False) -> Callable[[AttentionFactory], AttentionFactory]:
    """Decorator adding an attention class (or factory) under ``name``.

    The factory is called as ``factory(dim, num_heads, *, num_features, causal, dropout, seed, **kw)``
    and returns a module whose ``forward(x, key_padding_mask=None)`` maps ``(B, N, dim)`` to itself.
    """
    return ATTENTIONS.register(name, override=override)


def _all_names() -> Registry[None]:
    """The registered attentions and every ``"<component>-<matrix>"`` pair, listed by component."""

    def family(name: str) -> str:
        pair = split_pair(name)
        return f"{pair[0]}-<matrix>" if pair else "named"

    merged: Registry[None] = Registry("attention", family=family)
    pairs = [f"{c}-{m}" for c in rf_features.names() for m in rf_matrices.names()]
    for name in [*ATTENTIONS.names(), *pairs]:
        merged.register(name, override=True)(None)
    return merged


def names(pattern: str | None = None) -> list[str]:
    """Every attention name: the registered ones and each ``"<component>-<matrix>"`` pair, sorted."""
    return _all_names().names(pattern)


def feature_pair(name: str) -> tuple[str, str] | None:
    """The ``rf_features.create`` component and matrix behind an attention name, or None for other attentions.

    ``"posrf-hyp-orf"`` -> ``("posrf-hyp", "orf")`` (see `split_pair`); a learned map of
    ``rf_features.learned_names()`` -> ``(name, LEARNED_MAP_MATRIX)``, the matrix whose draw starts it.
    """
    if name.lower() in rf_features.learned_names():
        return name.lower(), LEARNED_MAP_MATRIX
    return split_pair(name)


def split_pair(name: str) -> tuple[str, str] | None:
    """``"posrf-hyp-orf"`` -> ``("posrf-hyp", "orf")``; None unless a component and a matrix match."""
    for matrix in rf_matrices.names():
        component = name.removesuffix(f"-{matrix}")
        if component != name and component in rf_features.names():
            return component, matrix
    return None


def create(
    name: str,
    dim: int,
    num_heads: int,
    *,
    num_features: int = 128,
    causal: bool = False,
    dropout: float = 0.0,
    seed: int | None = None,
    **kw: Any,
) -> nn.Module:
    """A multi-head self-attention module ``(B, N, dim) -> (B, N, dim)`` by name.

    Names: ``"softmax"``, ``"performer"`` (= ``"posrf-orf"``, FAVOR+), every ``"<component>-<matrix>"`` pair
    of ``rf_features.names()`` and ``rf_matrices.names()`` (e.g. ``"oprf-fastfoodl"``), the learned maps
    ``"hedgehog"`` and ``"t2r"`` (``rf_features.learned``: per-head trainable projections, a learned kernel
    rather than an estimate of softmax's), and the baselines of [`names`][rf_attention.names]. Extra keyword
    arguments go to the attention (``kernel``,
    ``redraw_interval``, ``attention_dropout``, ``matrix_options``, ...).

    ``seed`` seeds all of the module's randomness except dropout (which draws from the global torch RNG):
    its random features or hashes and the initial projections, which
    [`reset_projections`][rf_attention.MultiheadSelfAttention.reset_projections] draws from ``seed``
    here also for modules that replace their projections after construction. Two modules created with
    the same name, arguments and seed are equal, whatever the global torch seed.
    """
    key = name.lower() if isinstance(name, str) else name
    if isinstance(key, str) and key not in ATTENTIONS:
        pair = split_pair(key)
        if pair is None:
            raise ValueError(_all_names().unknown_name_message(name))
        factory: AttentionFactory = functools.partial(
            RandomFeatureAttention, component=pair[0], weight_matrix=pair[1]
        )
    else:
        factory = ATTENTIONS.get(key)
        if kw.get("window") and key not in ("softmax", "performer", *rf_features.learned_names()):
            raise ValueError(
                f"window: {name!r} has no sliding window (got window={kw['window']!r}); a window takes "
                "'softmax', a random-feature pair or a learned map"
            )
    module = factory(
        dim, num_heads, num_features=num_features, causal=causal, dropout=dropout, seed=seed, **kw
    )
    if seed is not None and isinstance(module, MultiheadSelfAttention):
        module.reset_projections(seed)
    return module


@register("softmax")
def _softmax(
    dim: int, num_heads: int, *, num_features: int = 128, seed: int | None = None, **kw: Any
) -> nn.Module:
    """Exact softmax attention; ``num_features`` does not apply, ``seed`` seeds the projections."""
    return SoftmaxAttention(dim, num_heads, seed=seed, **kw)


@register("performer")
def _performer(dim: int, num_heads: int, **kw: Any) -> nn.Module:
    """FAVOR+ (Choromanski et al. 2021): positive random features with orthogonal rows, ``posrf-orf``."""
    return RandomFeatureAttention(dim, num_heads, component="posrf", weight_matrix="orf", **kw)


def _learned_map_attention(
    dim: int, num_heads: int, *, component: str, learnable: bool = True, **kw: Any
) -> nn.Module:
    """Kernelized attention with the learned map ``component`` (``rf_features.learned``), per head."""
    return RandomFeatureAttention(
        dim, num_heads, component=component, weight_matrix=LEARNED_MAP_MATRIX, learnable=learnable, **kw
    )


for _learned in rf_features.learned_names():
    register(_learned)(functools.partial(_learned_map_attention, component=_learned))
