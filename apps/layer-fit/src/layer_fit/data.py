"""The synthetic data of the paper's single-layer fit: ``Y = f(X W^T)`` with X, W i.i.d. Unif[0, 1].

``t = X W^T`` is centered by its mean (per unit, or by the one mean of all entries), ``Y = f(t)``, and both
``X`` and ``Y`` are standardized per column, so a fitted model maps standardized inputs to standardized
outputs and its MSE is in standardized units (1.0 is the MSE of predicting every column's mean).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

import ralimp


def center_columns(t: torch.Tensor) -> torch.Tensor:
    """Each unit's pre-activation minus its mean over the samples (the bias ``b_j = -E_x[w_j . x]``)."""
    return t - t.mean(0, keepdim=True)


def center_global(t: torch.Tensor) -> torch.Tensor:
    """The pre-activation minus the one mean of all its entries."""
    return t - t.mean()


#: ``--center`` name -> centering of the pre-activation ``t = X W^T``.
CENTERINGS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "column": center_columns,
    "global": center_global,
}


def standardize(a: torch.Tensor) -> torch.Tensor:
    """``(a - mean) / std`` per column (population std); a constant column is an error."""
    std = a.std(0, unbiased=False, keepdim=True)
    if bool((std == 0).any()):
        raise ValueError(f"a: {int((std == 0).sum())} constant columns cannot be standardized")
    return (a - a.mean(0, keepdim=True)) / std


@dataclass(frozen=True)
class LayerData:
    """Standardized inputs ``x (samples, dim)`` and targets ``y (samples, dim)`` of one activation."""

    x: torch.Tensor
    y: torch.Tensor
    activation: str

    @property
    def calibration_sample(self) -> torch.Tensor:
        """The inputs a replacement is calibrated on: the first 4096 rows of ``x`` (all, if fewer)."""
        return self.x[:4096]


def make_data(
    activation: str,
    *,
    samples: int = 8192,
    dim: int = 256,
    seed: int = 0,
    center: str = "column",
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> LayerData:
    """Standardized ``X`` and ``Y = f(centered X W^T)``, with ``X``, ``W`` i.i.d. Unif[0, 1] from ``seed``.

    ``W`` is drawn first, then ``X``.

    Computed in float64 on the CPU (the same numbers on every device), then cast to ``dtype`` on ``device``.

    Args:
        activation: a name registered in ``ralimp.ACTIVATIONS``.
        samples: rows of ``X``.
        dim: columns of ``X``; ``W`` is ``(dim, dim)``.
        seed: seed of ``W`` and ``X``.
        center: a key of [`CENTERINGS`][layer_fit.CENTERINGS].
        device: where the tensors go.
        dtype: their dtype.
    """
    fn = ralimp.ACTIVATIONS.get(activation)
    if center not in CENTERINGS:
        raise ValueError(f"center: expected one of {', '.join(CENTERINGS)}, got {center!r}")
    gen = torch.Generator().manual_seed(seed)
    w = torch.rand(dim, dim, generator=gen, dtype=torch.float64)
    x = torch.rand(samples, dim, generator=gen, dtype=torch.float64)
    t = CENTERINGS[center](x @ w.T)
    y = fn(t)
    return LayerData(
        standardize(x).to(device=device, dtype=dtype),
        standardize(y).to(device=device, dtype=dtype),
        activation.lower(),
    )
