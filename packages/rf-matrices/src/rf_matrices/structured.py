"""Weight matrices applied by fast Walsh-Hadamard transforms.

SORF (Eq. 15), FastFood (Eq. 13) and the learnable FastFood_L (Section 3.1.8).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rf_matrices.hadamard import fwht, next_power_of_two
from rf_matrices.registry import register
from rf_matrices.weight_matrix import WeightMatrix, chi_samples


def rademacher(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Independent +-1 entries in float64."""
    bits = torch.randint(0, 2, shape, generator=generator, device=generator.device)
    return bits.to(torch.float64) * 2 - 1


class BlockTransform(WeightMatrix):
    """Shape logic shared by the Hadamard-based matrices.

    ``d`` is zero-padded to ``d' = 2^k``, and ``ceil(s / d')`` independent ``d' x d'`` blocks are stacked,
    the last one truncated to reach ``s`` rows.

    ``forward`` applies the fast transform ([`transform`][rf_matrices.BlockTransform.transform], O(s log d)
    per row) or multiplies by the dense ``W`` built once per call from it (O(s d) per row, one matrix
    product), whichever is faster: ``fast_transform=None`` (default) takes the dense product for
    ``d' <= DENSE_MAX_DIM``, where it won every measurement on CPU (see the Performance page);
    ``True``/``False`` force one path. Both give the same result (tested in float64) and the same gradients.

    Args:
        fast_transform: None (automatic), True (always the transform) or False (always the dense product).
    """

    #: Largest padded dimension for which the automatic choice takes the dense product.
    DENSE_MAX_DIM = 512

    def __init__(self, num_features: int, dim: int, *, fast_transform: bool | None = None, **kw: Any) -> None:
        super().__init__(num_features, dim, **kw)
        self.padded_dim = next_power_of_two(self.dim)
        self.num_blocks = math.ceil(self.num_features / self.padded_dim)
        auto = self.padded_dim > self.DENSE_MAX_DIM
        self.fast_transform = auto if fast_transform is None else fast_transform

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T``: ``(..., d)`` -> ``(..., s)``, by the fast transform or the dense product."""
        self.check_input(x)
        if self.fast_transform:
            return self.transform(x)
        return x @ self.cached("matrix", x.dtype, lambda: self.matrix().to(x.dtype)).mT

    def matrix(self) -> torch.Tensor:
        """The dense ``W``, ``(s, d)``: the fast transform applied to the identity."""
        eye = torch.eye(self.dim, dtype=self._float_dtype(), device=self._device())
        return self.transform(eye).mT

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T`` by the fast Walsh-Hadamard transforms, without building ``W``."""
        raise NotImplementedError

    def _blocks_in(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., d)`` -> ``(..., num_blocks, d')``: zero-padded and repeated for every block."""
        x = torch.nn.functional.pad(x, (0, self.padded_dim - self.dim))
        return x.unsqueeze(-2).expand(*x.shape[:-1], self.num_blocks, self.padded_dim)

    def _blocks_out(self, y: torch.Tensor) -> torch.Tensor:
        """``(..., num_blocks, d')`` -> ``(..., s)``."""
        return y.flatten(-2)[..., : self.num_features]


@register("sorf")
class SORF(BlockTransform):
    r"""Structured ORF, $W = \frac{\sqrt{d}}{\sigma} H D_1 H D_2 H D_3$ per block (Eq. 15, Yu et al. 2016).

    $H$ is the normalized Walsh-Hadamard matrix and $D_1, D_2, D_3$ diagonal Rademacher matrices, so each
    block is orthogonal times $\sqrt{d'}$ and rows have the Gaussian's typical norm $\sqrt{d} / \sigma$
    (exactly $\sqrt{d'} / \sigma$ before the zero-padded columns are dropped). Applied with three fast
    Walsh-Hadamard transforms (O(s log d) per input row, W never built) or the dense product (see
    [`BlockTransform`][rf_matrices.BlockTransform]).
    """

    signs: torch.Tensor  # (3, blocks, d') Rademacher diagonals D1, D2, D3

    def __init__(self, num_features: int, dim: int, **kw: Any) -> None:
        super().__init__(num_features, dim, **kw)
        self._resample()

    def _resample(self) -> None:
        shape = (3, self.num_blocks, self.padded_dim)
        self._set_state(signs=rademacher(shape, self.generator))

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T`` with three fast Walsh-Hadamard transforms per block."""
        d1, d2, d3 = self.signs.to(x.dtype)
        y = fwht(self._blocks_in(x) * d3)
        y = fwht(y * d2)
        y = fwht(y * d1)
        return self._blocks_out(y) * (math.sqrt(self.padded_dim) / self.sigma)


@register("fastfood")
class FastFood(BlockTransform):
    r"""FastFood, $W = \frac{1}{\sigma \sqrt{d'}} S H G \Pi H B$ per block (Eq. 13, Le et al. 2013).

    With the unnormalized Hadamard $H$ (entries $\pm 1$), a random permutation $\Pi$, diagonal
    Rademacher $B$, Gaussian $G$ and the scaling $S_{ii} = s_i / \lVert G \rVert_F$ with $s_i \sim \chi(d')$:
    every row of $H G \Pi H B$ has norm $\sqrt{d'} \lVert G \rVert_F$, so the rows of $W$ have exactly the
    $\chi(d')$ norms of Gaussian rows. (The paper prints $\lVert G \rVert_F^{-1/2}$; only the exponent -1
    gives Gaussian row norms.)
    Applied with two fast Walsh-Hadamard transforms (O(s log d) per input row, W never built) or the dense
    product (see [`BlockTransform`][rf_matrices.BlockTransform]).
    """

    #: names of the diagonals trained by gradient descent (none for the fixed FastFood).
    learnable_diagonals: tuple[str, ...] = ()
    binary: torch.Tensor  # (blocks, d') B
    gaussian: torch.Tensor  # (blocks, d') G
    scale: torch.Tensor  # (blocks, d') S
    permutation: torch.Tensor  # (blocks, d') Pi

    def __init__(self, num_features: int, dim: int, **kw: Any) -> None:
        super().__init__(num_features, dim, **kw)
        self._resample()

    def _resample(self) -> None:
        g = self.generator
        nb, dp = self.num_blocks, self.padded_dim
        gauss = torch.randn(nb, dp, generator=g, dtype=torch.float64, device=g.device)
        scale = chi_samples(nb * dp, dp, g).reshape(nb, dp) / gauss.norm(dim=-1, keepdim=True)
        perm = torch.stack([torch.randperm(dp, generator=g, device=g.device) for _ in range(nb)])
        self._set_state(
            self.learnable_diagonals,
            binary=rademacher((nb, dp), g),
            gaussian=gauss,
            scale=scale,
            permutation=perm,
        )

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T`` with two fast Walsh-Hadamard transforms per block.

        ``H G Pi H B / sqrt(d')`` equals ``sqrt(d') Hn G Pi Hn B`` with the normalized ``Hn`` of
        [`fwht`][rf_matrices.fwht].
        """
        y = fwht(self._blocks_in(x) * self.binary.to(x.dtype))
        y = torch.gather(y, -1, self.permutation.expand(y.shape))
        y = fwht(y * self.gaussian.to(x.dtype)) * self.scale.to(x.dtype)
        return self._blocks_out(y) * (math.sqrt(self.padded_dim) / self.sigma)


@register("fastfoodl")
class FastFoodL(FastFood):
    """Learnable FastFood (Section 3.1.8; Yang et al. 2015, Chowdhury et al. 2022).

    The FastFood of Eq. 13 with the scaling ``S`` as an ``nn.Parameter`` (FSARD), initialized as in FastFood;
    with ``learn_gb=True`` the Gaussian ``G`` and the sign diagonal ``B`` are trained too (FSGBARD; ``B``
    starts at +-1 and becomes a real diagonal). The permutation stays fixed. Being learned, the matrix is not
    redrawn: `redraw` is a no-op.

    Args:
        learn_gb: also learn ``G`` and ``B``.
    """

    redrawable = False

    def __init__(self, num_features: int, dim: int, *, learn_gb: bool = False, **kw: Any) -> None:
        self.learnable_diagonals = ("scale", "gaussian", "binary") if learn_gb else ("scale",)
        super().__init__(num_features, dim, **kw)

    def extra_repr(self) -> str:
        """The sizes and options shown by ``repr``."""
        return f"{super().extra_repr()}, learnable={self.learnable_diagonals}"
