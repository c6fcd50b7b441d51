r"""The low-rank baseline: ``activation(U (V x) + b)`` with the truncated SVD of a pretrained ``W``."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ralimp.base import Elementwise, ExactActivation, LinearSource, check_input
from ralimp.budget import check_budget, check_count, refuse_fixed
from spectraformer_core import check_positive_int


class LowRank(ExactActivation):
    """``activation(U (V x) + b)`` with ``W ~ U V`` of rank ``r`` (the truncated SVD of a pretrained ``W``).

    Args:
        in_features: ``d``.
        out_features: ``l``.
        activation: registered name or elementwise callable (applied exactly).
        rank: ``r``.
        bias: learn a bias.
        seed: seed of the random initialization (``from_linear`` overwrites it with the SVD factors).
        device: where parameters live.
        dtype: parameter dtype.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        activation: str | Elementwise = "gelu",
        rank: int = 32,
        bias: bool = True,
        seed: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        factory = self.set_up(in_features, out_features, activation, device, dtype)
        self.rank = check_positive_int("rank", rank)
        self.down = nn.Linear(in_features, rank, bias=False, **factory)
        self.up = nn.Linear(rank, out_features, bias=bias, **factory)
        if seed is not None:
            gen = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for linear in (self.down, self.up):
                    bound = 1 / math.sqrt(linear.in_features)
                    draw = torch.rand(linear.weight.shape, generator=gen, dtype=torch.float64)
                    linear.weight.copy_((2 * draw - 1) * bound)

    @property
    def num_random_features(self) -> int:
        """The rank (the budget the paper matches across methods)."""
        return self.rank

    @property
    def feature_dim(self) -> int:
        """The rank ``r``, the width between ``V`` and ``U``."""
        return self.rank

    @classmethod
    def budget_options(
        cls, budget: int | None, activation: object = None, *, count: str = "paper", **overrides: Any
    ) -> dict[str, int]:
        """``rank = B`` under both counting rules."""
        check_count(count)
        refuse_fixed("rank", overrides)
        return {"rank": check_budget(budget)}

    def initialize_from(self, source: LinearSource) -> None:
        """``U V``: the rank-``r`` truncated SVD of ``linear.weight`` (Eckart-Young).

        ``init="psi"``: the plain SVD, best in Frobenius norm. ``init="lstsq"``: best in the least-squares
        sense on ``sample``, ``min ||(W - U V) x||^2`` over the sample (SVD of ``W L`` with ``L L^T`` the
        sample's second-moment matrix plus ``ridge`` times its mean eigenvalue).
        """
        linear, sample, ridge = source.linear, source.sample, source.ridge
        weight = linear.weight.detach().to(torch.float64)
        if source.init == "lstsq":
            x = check_input(sample, linear.in_features).detach().reshape(-1, linear.in_features).to(weight)
            second = x.mT @ x / x.shape[0]
            second.diagonal().add_(ridge * float(second.diagonal().mean()) + 1e-12)
            root = torch.linalg.cholesky(second)
            u, s, vh = torch.linalg.svd(weight @ root, full_matrices=False)
            vh = torch.linalg.solve_triangular(root, vh, upper=False, left=False)
        else:
            u, s, vh = torch.linalg.svd(weight, full_matrices=False)
        r = min(self.rank, s.numel())
        root_s = s[:r].sqrt()
        self.up.weight.zero_()
        self.down.weight.zero_()
        self.up.weight[:, :r] = u[:, :r] * root_s
        self.down.weight[:r] = root_s.unsqueeze(-1) * vh[:r]
        if linear.bias is not None:
            self.up.bias.copy_(linear.bias)

    def linear_map(self, x: torch.Tensor) -> torch.Tensor:
        """``U (V x) + b``."""
        return self.up(self.down(x))
