"""What a method's features allow: the fixed-projection information floor and the Eckart-Young floor.

Every linearized layer computes ``Phi(X) Psi^T`` (a readout of its features, plus the output head):

- the *information floor* of a layer's fixed random projections is the least MSE any readout of its
  features at initialization reaches, ``min_{Psi, c} ||Y - Phi(X) Psi^T - 1 c^T||^2 / (n d)`` (least
  squares in float64). Training ``Psi`` alone cannot go below it; training ``W`` or the poles changes
  ``Phi`` only through its frequencies;
- the *Eckart-Young floor* of rank ``r`` is the least MSE of any rank-``r`` matrix,
  ``sum_{i > r} sigma_i(Y)^2 / (n d)``: no separable layer of width ``F`` beats it at ``r = F`` (``F + 1``
  with the output head's shift), whatever its features.

LowRank ``f(U V x + b)`` applies the activation after its rank-``r`` map and has no fixed features: neither
floor bounds it.
"""

from __future__ import annotations

import torch
from torch import nn

import ralimp


def fixed_features(layer: nn.Module) -> nn.Module | None:
    """The feature map ``Phi`` of a linearized layer (compressed or not), or None (LowRank, dense)."""
    if isinstance(layer, ralimp.CompressedLinearization):
        return layer.features
    if isinstance(layer, ralimp.FeatureLinearization):
        return layer.feature_map
    return None


@torch.no_grad()
def information_floor(phi: torch.Tensor, y: torch.Tensor) -> float:
    """``min_{Psi, c} ||y - phi Psi^T - 1 c^T||^2 / y.numel()`` for features ``phi (n, F)`` and ``y (n, d)``.

    Solved in float64 by ``torch.linalg.lstsq`` (``gelsd``) on ``[phi, 1]`` with unit-norm columns
    (all-zero columns, e.g. SNNK's frequency 0, stay zero). Non-finite features give ``inf``.
    """
    phi = phi.detach().double()
    if not bool(torch.isfinite(phi).all()):
        return float("inf")
    y = y.detach().double().to(phi.device)
    design = torch.cat([phi, torch.ones_like(phi[:, :1])], -1)
    design = design / design.norm(dim=0).clamp_min(1e-300)
    solution = torch.linalg.lstsq(design.cpu(), y.cpu(), driver="gelsd").solution
    residual = y.cpu() - design.cpu() @ solution
    return float(residual.pow(2).mean())


def singular_values(y: torch.Tensor) -> torch.Tensor:
    """``sigma_i(y)`` in float64, descending (computed once per target, reused for every rank)."""
    return torch.linalg.svdvals(y.detach().double().cpu())


def eckart_young_floor(sigma: torch.Tensor, rank: int, numel: int) -> float:
    """``sum_{i > rank} sigma_i^2 / numel``: the least MSE of a rank-``rank`` approximation (Eckart-Young)."""
    return float(sigma[rank:].pow(2).sum() / numel)
