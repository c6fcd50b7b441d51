r"""Learned feature maps, the conversion baselines: Hedgehog/LoLCATs' softmax map and T2R's ReLU map.

Their ``phi(q) . phi(k)`` is a *learned* kernel, trained (attention transfer, fine-tuning) to reproduce
softmax attention after normalization; it estimates nothing, and ``exp(q . k)`` is not its expectation
over any draw. They run wherever a [`FeatureMap`][rf_features.FeatureMap] does (the attention's generic
path: no closed form, autograd through
[`log_features`][rf_features.learned.HedgehogFeatureMap.log_features]). A sliding-window hybrid that
weights its window by the exact ``exp(q . k / sqrt(Dh))`` mixes the two parts, with them, by LoLCATs'
learned factor ``sigmoid(window_logit)`` (one per head), since ``phi(q) . phi(k)`` has a scale of its own:
the random-feature pairs need none, their product estimating the same kernel as the window's.

Both hold their projection ``W`` as a trainable weight matrix (per head with ``num_heads``), so
``learnable=True`` is their only form; ``num_features`` is the rows ``s`` of ``W``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rf_features.feature_map import FeatureMap


class LearnedFeatureMap(FeatureMap):
    """A feature map whose projection ``W (s, d)`` (``(H, s, d)`` per head) is learned.

    ``W`` starts from [`initial_matrix`][rf_features.learned.LearnedFeatureMap.initial_matrix] of the
    seeded draw of ``weight_matrix``. The features carry no component weights (the random pairs' ``1/s``):
    they are exactly the map's formula.

    With ``window_factor=True`` the map also holds ``window_logit`` (``()``, ``(H, 1, 1)`` per head), the
    logit of LoLCATs' mixing factor between a sliding window's exact weights and the features
    ([`rf_attention.ops.window`][rf_attention.ops.window]), starting at 0 (factor 1/2, LoLCATs'
    ``init_window_factor=0``); without it ``window_logit`` is None and the map takes no window. The factor
    lives on the map because every attention path (the functional ``rf_attention``, the modules, decoding,
    the Hugging Face layers) receives the map: it reaches each of them with no argument of its own and sits
    in the state dict beside ``W`` (checkpoints, ``save_pretrained``, attention transfer's parameters). It
    is opt-in (the modules and ``linearize`` set it with a window) so that a map without a window holds no
    parameter that never receives a gradient (``DistributedDataParallel`` refuses those by default) and
    its state dict keeps its keys.

    Args:
        dim: ``d``.
        weight_matrix: the ``rf_matrices`` name whose seeded draw initializes the rows of ``W`` that the
            map's own start leaves free.
        num_features: ``s``, the rows of ``W``.
        seed: seed of that draw.
        kernel: ``"softmax"`` only (the kernel they are trained towards).
        learnable: True only (a learned map has no fixed form).
        num_heads: one ``W`` per head for inputs ``(B, H, n, d)``.
        window_factor: hold ``window_logit``, the sliding window's learned factor (one per head).
        **kw: more [`FeatureMap`][rf_features.FeatureMap] arguments (``input_map``, ``statistics_mode``).
    """

    def __init__(
        self,
        dim: int,
        *,
        weight_matrix: str = "orf",
        num_features: int = 128,
        seed: int | None = None,
        kernel: str = "softmax",
        learnable: bool = True,
        num_heads: int | None = None,
        window_factor: bool = False,
        **kw: Any,
    ) -> None:
        name = type(self).__name__
        if not learnable:
            raise ValueError(
                f"learnable: {name} is a learned feature map (its projection starts at "
                "initial_matrix and is trained), so it exists with learnable=True only; got False"
            )
        if kernel != "softmax":
            raise ValueError(f"kernel: {name} learns the softmax kernel only, got {kernel!r}")
        if not isinstance(weight_matrix, str):
            raise ValueError(f"weight_matrix: expected an rf_matrices name for {name}, got {weight_matrix!r}")
        super().__init__(
            dim,
            weight_matrix=weight_matrix,
            num_features=num_features,
            seed=seed,
            kernel=kernel,
            learnable=True,
            num_heads=num_heads,
            **kw,
        )
        weight = self.weight_matrix.weight  # a DrawnMatrix's: (s, d) or (H, s, d)
        assert isinstance(weight, nn.Parameter), "rf_matrices.create(..., learnable=True) gives a parameter"
        with torch.no_grad():
            weight.copy_(self.initial_matrix(weight.detach()))
        self.window_logit: nn.Parameter | None = None
        if window_factor:
            self.window_logit = nn.Parameter(torch.zeros(() if num_heads is None else (num_heads, 1, 1)))

    def window_log_factor(self) -> torch.Tensor:
        r"""$\log f = \log \sigma(\text{window\_logit})$, LoLCATs' window factor: ``()`` or ``(H, 1, 1)``.

        Raises:
            ValueError: the map was created without ``window_factor=True``.
        """
        if self.window_logit is None:
            raise ValueError(
                f"window_factor: {type(self).__name__} is a learned map, whose phi(q) . phi(k) estimates no "
                "exp(q . k / sqrt(Dh)); a sliding window mixes the two by a learned factor, which this map "
                "was created without; create it with window_factor=True (the modules and linearize do so "
                "with a window)"
            )
        return F.logsigmoid(self.window_logit)

    def initial_matrix(self, drawn: torch.Tensor) -> torch.Tensor:
        """The starting ``W`` from the seeded draw ``drawn`` (same shape): the draw, rows of about unit norm.

        A Monte Carlo row has norm about ``sqrt(d)``; divided by it, a row's projection of ``x`` is about as
        large as one coordinate of ``x``.
        """
        return drawn / math.sqrt(self.dim)

    def _component_weights(self, dtype: torch.dtype, device: torch.device) -> tuple[float, None]:
        """No component weights: the features are the map's formula as it stands."""
        return 0.0, None


class HedgehogFeatureMap(LearnedFeatureMap):
    r"""Hedgehog's map (Zhang et al. 2024), as LoLCATs converts with it.

    $\phi(x) = [\mathrm{softmax}(xW^\top), \mathrm{softmax}(-xW^\top)]$.

    The softmax runs over the ``s`` features of each row (not over positions), so every feature is positive
    and each half sums to 1; the width is ``2 s``. ``W`` starts at the identity (Hedgehog's start): its
    first ``min(s, d)`` rows are the unit vectors, and any further rows come from the draw (scaled as
    [`initial_matrix`][rf_features.learned.LearnedFeatureMap.initial_matrix] says), so that no two rows start
    equal (equal rows would get equal gradients and stay equal). ``num_features = d`` gives Hedgehog's
    ``d x d`` projection and width ``2 d``. With ``input_map=True`` queries and keys get their own maps
    before ``W``, Hedgehog's separate query and key projections.
    """

    features_per_row = 2
    positive = True

    def initial_matrix(self, drawn: torch.Tensor) -> torch.Tensor:
        """The identity in the first ``min(s, d)`` rows, the scaled draw below."""
        start = super().initial_matrix(drawn).clone()
        rows = min(start.shape[-2], self.dim)
        start[..., :rows, :] = torch.eye(rows, self.dim, dtype=start.dtype)
        return start

    def log_features(
        self, projection: torch.Tensor, sqnorm: torch.Tensor, stats: dict[str, torch.Tensor], is_query: bool
    ) -> tuple[torch.Tensor, None]:
        """``[log_softmax(p), log_softmax(-p)]`` of ``projection (..., n, s)``: ``(..., n, 2 s)``."""
        return torch.cat((projection.log_softmax(-1), (-projection).log_softmax(-1)), dim=-1), None


class T2RFeatureMap(LearnedFeatureMap):
    r"""T2R's map (Kasai et al. 2021): $\mathrm{relu}(xW^\top + b)$, width ``s``.

    ``W`` starts at the scaled draw of ``weight_matrix`` (random ReLU features), the bias ``b`` (``(s,)``,
    ``(H, 1, s)`` per head) at 0. The features are non-negative and can all be 0 for a query, whose output
    is then 0 (the normalizer's guard).
    """

    def __init__(self, dim: int, **kw: Any) -> None:
        super().__init__(dim, **kw)
        s = self.weight_matrix.num_features
        shape = (s,) if self.num_heads is None else (self.num_heads, 1, s)
        self.bias = nn.Parameter(torch.zeros(shape))

    def log_features(
        self, projection: torch.Tensor, sqnorm: torch.Tensor, stats: dict[str, torch.Tensor], is_query: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """No log-magnitude (``(..., n, 1)`` zeros) and the multiplier ``relu(projection + b)``."""
        return projection.new_zeros(*projection.shape[:-1], 1), torch.relu(projection + self.bias)
