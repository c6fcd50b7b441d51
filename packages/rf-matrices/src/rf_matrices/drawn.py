"""A dense weight matrix drawn from any registered one: learnable, and one per attention head."""

from __future__ import annotations

from typing import Any

import torch

from rf_matrices.weight_matrix import WeightMatrix
from spectraformer_core import check_positive_int


class DrawnMatrix(WeightMatrix):
    r"""The dense $W$ of a ``source`` matrix, stored as one tensor: ``(s, d)``, or ``(H, s, d)`` per head.

    Built by ``rf_matrices.create(name, ..., learnable=True)`` and ``create(name, ..., num_heads=H)``. Each
    head's rows are an independent draw of ``source`` (the ``H`` draws follow one another from the
    generator), so ORF starts orthogonal within each block and every head has the source's distribution.
    Structured sources (``sorf``, ``fastfood``, ``fastfoodl``) become the dense matrix they draw: a learned
    $W$ has ``s x d`` free entries, not the source's diagonals (the attention kernels use the dense $W$ of a
    learned matrix anyway). Quadrature sources (``qmc``, ``mm``, ``sgq``) keep their component weights, fixed:
    the rule's weights go with its nodes' initial positions; the heads of a rule whose weights are random
    (``sgq`` ``rule="spherical-radial"``) would need one set of weights each and are refused.

    ``learnable=True`` makes ``weight`` an ``nn.Parameter`` (float32 by default, and so under autocast) that
    is never redrawn: `redraw` is a no-op, since a redraw would throw away what was learned. With
    ``learnable=False`` (per-head draws only) it is a buffer and `redraw` draws all heads afresh.

    Args:
        source: the [`WeightMatrix`][rf_matrices.WeightMatrix] class whose draws initialize ``W``.
        num_features: ``s``.
        dim: ``d``.
        learnable: ``W`` is a trainable parameter.
        num_heads: ``H`` independent matrices ``(H, s, d)``, applied to inputs ``(..., H, n, d)``; None:
            one ``(s, d)``.
        sigma: as in [`WeightMatrix`][rf_matrices.WeightMatrix].
        seed: seeds the draws (the heads' draws follow one another from it).
        generator: an explicit ``torch.Generator`` instead of ``seed``.
        device: as in [`WeightMatrix`][rf_matrices.WeightMatrix].
        dtype: as in [`WeightMatrix`][rf_matrices.WeightMatrix].
        **source_options: the source's own options (e.g. ``rule`` for ``sgq``).
    """

    weight: torch.Tensor  # (s, d) or (H, s, d)
    quadrature_weights: torch.Tensor  # (s,), only for sources with component weights

    def __init__(
        self,
        source: type[WeightMatrix],
        num_features: int,
        dim: int,
        *,
        learnable: bool = False,
        num_heads: int | None = None,
        sigma: float = 1.0,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **source_options: Any,
    ) -> None:
        super().__init__(
            num_features, dim, sigma=sigma, seed=seed, generator=generator, device=device, dtype=dtype
        )
        self.source, self.source_options = source, source_options
        self.learnable = bool(learnable)
        self.redrawable = not self.learnable
        self.num_heads = None if num_heads is None else check_positive_int("num_heads", num_heads)
        self._resample()

    def _resample(self) -> None:
        draws = [
            self.source(
                self.num_features,
                self.dim,
                sigma=self.sigma,
                generator=self.generator,
                dtype=torch.float64,
                **self.source_options,
            )
            for _ in range(self.num_heads or 1)
        ]
        self.signed_weights = draws[0].signed_weights
        with torch.no_grad():
            weight = torch.stack([draw.matrix() for draw in draws])
        state = {"weight": weight if self.num_heads else weight[0]}
        weights = [draw.component_weights for draw in draws]
        if weights[0] is not None:
            if any(not torch.equal(w, weights[0]) for w in weights if w is not None):
                raise ValueError(
                    f"num_heads: the draws of {self.source.__name__}({self.source_options}) have random "
                    "quadrature weights, which one set cannot serve for every head; use a rule with fixed "
                    "weights (sgq's default 'stiefel' or 'smolyak') or num_heads=None"
                )
            state["quadrature_weights"] = weights[0]
        self._set_state(("weight",) if self.learnable else (), **state)

    @property
    def component_weights(self) -> torch.Tensor | None:
        """The source's quadrature weights ``(s,)`` (shared by the heads), or None."""
        return getattr(self, "quadrature_weights", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T``: ``(..., d)`` -> ``(..., s)``; per head ``(..., H, n, d)`` -> ``(..., H, n, s)``."""
        self.check_input(x)
        if self.num_heads is not None and (x.dim() < 3 or x.shape[-3] != self.num_heads):
            raise ValueError(
                f"x: expected shape (..., {self.num_heads}, n, {self.dim}) (num_heads={self.num_heads} "
                f"per-head matrices), got {tuple(x.shape)}"
            )
        return x @ self.weight.to(x.dtype).mT

    def matrix(self) -> torch.Tensor:
        """The stored ``W``: ``(s, d)``, or ``(H, s, d)`` per head."""
        return self.weight

    def extra_repr(self) -> str:
        """The source, sizes and options shown by ``repr``."""
        heads = "" if self.num_heads is None else f", num_heads={self.num_heads}"
        return f"source={self.source.__name__}, {super().extra_repr()}, learnable={self.learnable}{heads}"
