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


@torch.no_grad()
def projection_floor(
    weight: torch.Tensor,
    bias: torch.Tensor,
    directions: torch.Tensor,
    activation: str = "gelu",
    *,
    nodes: int = 64,
) -> float:
    r"""Least relative MSE of *any* function of ``directions @ x`` predicting ``f(W x + b)``, ``x ~ N(0, I)``.

    For standard-normal (LayerNorm-like) inputs, given $z = \Omega x$ each pre-activation is
    $t_l = b_l + a_l g_1 + s_l g_2$ with $g_1$ determined by $z$, $g_2 \sim \mathcal N(0, 1)$
    independent of it,
    $a_l = \lVert P w_l\rVert$, $s_l = \lVert (I - P) w_l\rVert$ ($P$ the projection on the rows of $\Omega$).
    The best predictor is $\mathbb E[f(t) | z]$ and its MSE is $\mathbb E_{g_1} \operatorname{Var}_{g_2}
    f(t)$;
    summed over the outputs and divided by $\sum_l \operatorname{Var} f(t_l)$ (the per-column standardized
    target). Gauss-Hermite quadrature with ``nodes`` points per variable, float64.

    Args:
        weight: ``(L, d)``.
        bias: ``(L,)``.
        directions: ``(k, d)``, the projections a method's features are functions of.
        activation: a ``ralimp`` activation name.
        nodes: quadrature points.
    """
    fn = ralimp.ACTIVATIONS.get(activation)
    w = weight.double()
    basis = torch.linalg.qr(directions.double().mT).Q  # (d, k), orthonormal columns spanning the rows
    a = (w @ basis).norm(dim=-1)
    s = (w - (w @ basis) @ basis.mT).norm(dim=-1)
    g, p = _hermite(nodes)
    t = bias.double()[:, None, None] + a[:, None, None] * g[:, None] + s[:, None, None] * g  # (L, g1, g2)
    y = fn(t)
    inner = (p * y).sum(-1)
    cond_var = (p * (y - inner.unsqueeze(-1)).pow(2)).sum(-1)  # Var over g2, (L, g1)
    floor = (p * cond_var).sum(-1)
    total = (p.outer(p) * (y - (p.outer(p) * y).sum((-1, -2), keepdim=True)).pow(2)).sum((-1, -2))
    return float(floor.sum() / total.sum())


def _hermite(nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilists' Gauss-Hermite points and weights (sum 1) for ``E g(xi)``, ``xi ~ N(0, 1)``.

    Golub-Welsch: eigenvalues of the Jacobi matrix with off-diagonal ``sqrt(k)``.
    """
    off = torch.arange(1, nodes, dtype=torch.float64).sqrt()
    jacobi = torch.diag(off, 1) + torch.diag(off, -1)
    points, vectors = torch.linalg.eigh(jacobi)
    return points, vectors[0].pow(2)


def information_floors(dims: tuple[int, ...] = (64, 256, 768), *, seeds: int = 3) -> list[dict[str, float]]:
    """Per ``d``: the projection floors at budget 32 of RaLiMP's random directions and of low-rank's.

    A ``d x d`` layer with entries ``Unif[0, 1]`` (the paper's synthetic layer, App. D.1) and rows scaled to
    unit norm, zero bias, GELU, standard-normal (LayerNorm-like) inputs. RaLiMP at budget 32
    (App. D.1: ``K = 2`` products of 8 projections, 3 nodes of 4) sees ``2 * 8 + 3 * 4 = 28`` random Gaussian
    directions, and ``2 * 32 = 64`` when the variance-aware fit chooses no atom (``J = 0``: the budget goes
    to the polynomial block); a rank-32 low-rank layer at initialization sees the 32 top right singular
    directions of ``W``
    (the best 32 directions for the linear part). Means over ``seeds``.
    """
    rows = []
    for d in dims:
        random_floor = poly_floor = svd_floor = 0.0
        for seed in range(seeds):
            gen = torch.Generator().manual_seed(seed)
            w = torch.rand(d, d, generator=gen, dtype=torch.float64)
            w = w / w.norm(dim=-1, keepdim=True)  # Var t = 1 per output for x ~ N(0, I)
            b = torch.zeros(d, dtype=torch.float64)
            omega = torch.randn(28, d, generator=gen, dtype=torch.float64)
            top = torch.linalg.svd(w, full_matrices=False).Vh[:32]
            random_floor += projection_floor(w, b, omega) / seeds
            poly = torch.randn(64, d, generator=gen, dtype=torch.float64)
            poly_floor += projection_floor(w, b, poly) / seeds
            svd_floor += projection_floor(w, b, top) / seeds
        rows.append(
            {
                "d": d,
                "ralimp_28_random": random_floor,
                "ralimp_64_random": poly_floor,
                "lowrank_32_top_svd": svd_floor,
            }
        )
    return rows


def main() -> None:
    """Print the table of `information_floors` (``python -m layer_fit.floors``)."""
    print("| d | RaLiMP J = 1: 28 random directions | RaLiMP J = 0: 64 random | low-rank: 32 top-SVD |")
    print("| --- | --- | --- | --- |")
    for row in information_floors():
        cells = (row["ralimp_28_random"], row["ralimp_64_random"], row["lowrank_32_top_svd"])
        print(f"| {row['d']} | " + " | ".join(f"{v:.3f}" for v in cells) + " |")


if __name__ == "__main__":
    main()
