"""The component functions of Section 3.2: TrigRF, PosRF, PosRF-Hyp, GERF, OPRF and SADERF.

Every one here is a member of the GERF family (Eq. 21, Likhosherstov et al. 2022)

    f^(1)(omega, x) = D exp(A ||omega||^2 + B omega.x + C ||x||^2),
    f^(2)(omega, y) = D exp(A ||omega||^2 + s B omega.y + C ||y||^2),
    B = sqrt(s (1 - 4A)),  C = -(s + 1) / 2,  D = (1 - 4A)^(d/4),

which for omega ~ N(0, I) gives E[f^(1) f^(2)] = exp(-||x - y||^2 / 2). The softmax kernel is that times
exp(||x||^2 / 2) exp(||y||^2 / 2) (Eq. 8), so here C becomes ``-s / 2``; the Gaussian target of
``kernel="gaussian"`` is recovered in [`FeatureMap`][rf_features.FeatureMap]. For ``s = -1``, B is imaginary
and the real estimate Re(f^(1) f^(2)) is written with the real features ``[cos(b omega.x), sin(b omega.x)]``
(``b = sqrt(1 - 4A)``) on both sides.
"""

from __future__ import annotations

import cmath
import math
from typing import Any

import torch

from rf_features.feature_map import FeatureMap, LogForm, masked_mean
from rf_features.registry import register


def gerf_log_features(
    projection: torch.Tensor,
    sqnorm: torch.Tensor,
    omega_sqnorm: torch.Tensor | None,
    a: torch.Tensor | float,
    s: int,
    dim: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """GERF features for the softmax kernel (Eq. 21 with ``C = -s/2``), as ``(log_magnitude, multiplier)``.

    The log-magnitude may be ``(..., n, 1)`` (broadcast over the features) when it does not depend on them.

    Args:
        projection: ``omega.x``, ``(..., n, r)``.
        sqnorm: ``||x||^2``, ``(..., n, 1)``.
        omega_sqnorm: ``||omega||^2``, ``(r,)`` (per head ``(H, r)``); may be None when ``a == 0``.
        a: the real parameter ``A < 1/4``: a float, or a tensor ``(...)`` per leading index.
        s: +1 (positive features, ``r`` columns) or -1 (cos/sin pairs, ``2r`` columns).
        dim: ``d``, for ``D = (1 - 4A)^(d/4)``.
    """
    if isinstance(a, torch.Tensor):
        a = a[..., None, None]
    one_minus_4a = 1 - 4 * a
    log_1m4a = torch.log(one_minus_4a) if isinstance(one_minus_4a, torch.Tensor) else math.log(one_minus_4a)
    log_d = dim / 4 * log_1m4a
    b = one_minus_4a**0.5
    log_mag = log_d - s * sqnorm / 2
    if omega_sqnorm is not None:
        log_mag = log_mag + a * omega_sqnorm.unsqueeze(-2)
    scaled = projection if isinstance(b, float) and b == 1.0 else b * projection
    if s == 1:
        return log_mag + scaled, None
    phase = scaled
    if log_mag.shape[-1] != 1:  # A != 0: one magnitude per row and feature, for the cos and the sin
        log_mag = torch.cat((log_mag, log_mag), dim=-1)
    return log_mag, torch.cat((torch.cos(phase), torch.sin(phase)), dim=-1)


def gerf_log_form(
    matrix: torch.Tensor, omega_sqnorm: torch.Tensor | None, a: torch.Tensor | float, s: int, dim: int
) -> LogForm:
    """[`gerf_log_features`][rf_features.gerf_log_features] as ``(A, beta, offset, trigonometric)`` (Eq. 21).

    ``A = sqrt(1 - 4A') W`` (``(..., s, d)`` for a per-index ``A'``), ``beta = -s/2``,
    ``offset = (d/4) log(1 - 4A') + A' ||omega||^2`` (twice, for cos and sin, when ``s = -1``).
    """
    if isinstance(a, torch.Tensor):
        a = a.unsqueeze(-1)
    one_minus_4a = 1 - 4 * a
    log_1m4a = torch.log(one_minus_4a) if isinstance(one_minus_4a, torch.Tensor) else math.log(one_minus_4a)
    offset = dim / 4 * log_1m4a
    if omega_sqnorm is not None:
        offset = offset + a * omega_sqnorm
    b = one_minus_4a**0.5
    scaled = b.unsqueeze(-1) * matrix if isinstance(b, torch.Tensor) else b * matrix
    if s == -1 and isinstance(offset, torch.Tensor) and offset.shape[-1] != 1:
        offset = torch.cat((offset, offset), dim=-1)
    return scaled, -s / 2, offset, s == -1


def gerf_relative_variance(a: complex, s: int, dim: int, sqnorm: float) -> float:
    """``Var(Re f^(1) f^(2)) / K^2`` of one GERF row (Eq. 21), ``omega ~ N(0, I_d)``, complex ``A`` allowed.

    With ``Z = f^(1)(omega, x) f^(2)(omega, y)`` and ``u = ||x + s y||^2`` (``sqnorm``), ``E Z = K`` is real
    for every ``A`` with ``Re A < 1/4``, and (for ``Re A < 1/8``, ``B = sqrt(s (1 - 4A))``)
    ``E Z^2 / K^2 = (1 - 4A)^d (1 - 8A)^(-d/2) exp(2 s (1 - 4A) u / (1 - 8A) - s u)``,
    ``E |Z|^2 / K^2 = |1 - 4A|^d (1 - 8 Re A)^(-d/2) exp(2 (Re B)^2 u / (1 - 8 Re A) - s u)``, and
    ``E (Re Z)^2 = (E |Z|^2 + Re E Z^2) / 2``. Principal roots and powers, as Eq. 21 states.
    """
    a = complex(a)
    if not a.real < 0.125:
        raise ValueError(f"a: expected Re A < 1/8 (finite variance), got {a!r}")
    one_4a, one_8a = 1 - 4 * a, 1 - 8 * a
    b = (s * one_4a) ** 0.5
    log_square = dim * cmath.log(one_4a) - dim / 2 * cmath.log(one_8a) + 2 * s * one_4a * sqnorm / one_8a
    log_modulus = dim * math.log(abs(one_4a)) - dim / 2 * math.log(1 - 8 * a.real)
    log_modulus += 2 * b.real**2 * sqnorm / (1 - 8 * a.real)
    log_modulus -= s * sqnorm
    if log_modulus > 700:  # beyond float range: |E Z^2| <= E |Z|^2, so the variance is as large
        return math.inf
    ratio = cmath.exp(log_square - s * sqnorm - log_modulus).real  # Re E Z^2 / E |Z|^2, in [-1, 1]
    return math.exp(log_modulus) * (1 + ratio) / 2 - 1


@register("gerf")
class GERF(FeatureMap):
    """Generalized exponential random features with a fixed ``A`` (Eq. 21, Likhosherstov et al. 2022).

    Args:
        a: the real parameter ``A`` (``A < 1/4``; the variance is finite for ``A < 1/8`` when ``s = +1``).
        s: +1 for positive features, -1 for the trigonometric (complex) branch.
        **kw: the [`FeatureMap`][rf_features.FeatureMap] arguments.
    """

    def __init__(self, dim: int, *, a: float = 0.0, s: int = 1, **kw: Any) -> None:
        if s not in (1, -1):
            raise ValueError(f"s: expected +1 or -1, got {s!r}")
        if isinstance(a, complex):
            raise ValueError(
                f"a: expected a real A (a complex A never lowers the variance and doubles the features; "
                f"see gerf_relative_variance), got {a!r}"
            )
        if not a < 0.25:
            raise ValueError(f"a: expected A < 1/4 (so that 1 - 4A > 0), got {a!r}")
        # set before FeatureMap.__init__, which chooses the weight matrix's rule from them
        self.a, self.s = float(a), s
        self.features_per_row = 1 if s == 1 else 2
        self.positive, self.even_in_omega = s == 1, s == -1
        super().__init__(dim, **kw)

    def log_features(
        self, projection: torch.Tensor, sqnorm: torch.Tensor, stats: dict[str, torch.Tensor], is_query: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """GERF features with this map's ``(A, s)``."""
        omega_sqnorm = self.omega_sqnorm(projection.dtype, stats) if self.a != 0 else None
        return gerf_log_features(projection, sqnorm, omega_sqnorm, self.a, self.s, self.dim)

    def log_form(self, matrix: torch.Tensor, stats: dict[str, torch.Tensor], is_query: bool) -> LogForm:
        """GERF's closed form with this map's ``(A, s)``."""
        omega_sqnorm = self.omega_sqnorm(matrix.dtype, stats) if self.a != 0 else None
        return gerf_log_form(matrix, omega_sqnorm, self.a, self.s, self.dim)

    def extra_repr(self) -> str:
        """``A``, ``s``, the kernel and the output width."""
        return f"a={self.a:g}, s={self.s}, {super().extra_repr()}"


@register("trigrf")
class TrigRF(GERF):
    r"""Trigonometric random features $[\cos \omega^\top x, \sin \omega^\top x] \, e^{\lVert x \rVert^2 / 2}$.

    Eq. 18 and Eq. 8. The cos/sin pair estimates the Gaussian kernel (Rahimi and Recht 2007); the factor
    $\exp(\lVert x \rVert^2 / 2)$ turns it into the softmax kernel. GERF with $A = 0, s = -1$. Unbounded
    relative variance as the kernel value goes to 0 (Section 3.2.2).
    """

    def __init__(self, dim: int, **kw: Any) -> None:
        super().__init__(dim, a=0.0, s=-1, **kw)


@register("posrf")
class PosRF(GERF):
    r"""Positive random features $\exp(\omega^\top x - \lVert x \rVert^2 / 2)$ (Eq. 19; FAVOR+).

    Choromanski et al. 2021. GERF with $A = 0, s = +1$; estimates the softmax kernel directly.
    """

    def __init__(self, dim: int, **kw: Any) -> None:
        super().__init__(dim, a=0.0, s=1, **kw)


@register("posrf-hyp")
class PosRFHyp(FeatureMap):
    r"""Hyperbolic positive random features, $\exp(\pm \omega^\top x - \lVert x \rVert^2 / 2) / \sqrt{2}$.

    Eq. 20. Two components per row ($l = 2$ in Eq. 11): PosRF with the antithetic pair
    $\{\omega, -\omega\}$, so the estimate is
    $\mathbb{E}[\cosh(\omega^\top (x + y))] \, e^{-\lVert x \rVert^2/2 - \lVert y \rVert^2/2} = e^{x^\top y}$.
    (Eq. 20 prints $-\lVert x \rVert^2$, the Gaussian-kernel version, which ``kernel="gaussian"`` gives.)
    """

    features_per_row = 2
    positive = True
    even_in_omega = True

    def log_features(
        self, projection: torch.Tensor, sqnorm: torch.Tensor, stats: dict[str, torch.Tensor], is_query: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The ``+omega`` and ``-omega`` components side by side."""
        base = -sqnorm / 2 - 0.5 * math.log(2)
        return torch.cat((base + projection, base - projection), dim=-1), None

    def log_form(self, matrix: torch.Tensor, stats: dict[str, torch.Tensor], is_query: bool) -> LogForm:
        """``A = [W; -W]``, ``beta = -1/2``, ``offset = -log(2) / 2``."""
        return torch.cat((matrix, -matrix), dim=-2), -0.5, -0.5 * math.log(2), False


def oprf_optimal_a(sum_sqnorm: torch.Tensor, dim: int) -> torch.Tensor:
    r"""The variance-optimal $A$ of OPRF (Eq. 22) for $u = \lVert x + y \rVert^2$.

    $A = (1 - 1/p^*) / 8$ with $p^* = (\sqrt{(2u + d)^2 + 8du} - 2u - d) / (4u)$, evaluated in the
    cancellation-free form $p^* = 2d / (\sqrt{(2u + d)^2 + 8du} + 2u + d)$ ($p^* \to 1$, $A \to 0$ as
    $u \to 0$). It minimizes the second moment $(1-4A)^d (1-8A)^{-d/2} \exp(2(1-4A)u / (1-8A))$ over
    $A < 1/8$.
    """
    u = sum_sqnorm.clamp_min(0)
    p = 2 * dim / (torch.sqrt((2 * u + dim) ** 2 + 8 * dim * u) + 2 * u + dim)
    return (1 - 1 / p) / 8


def mean_pair_sqnorm(
    q: torch.Tensor, k: torch.Tensor, query_mask: torch.Tensor | None, key_mask: torch.Tensor | None
) -> torch.Tensor:
    """``mean_{i,j} ||q_i + k_j||^2 = mean ||q||^2 + mean ||k||^2 + 2 mean(q) . mean(k)``, per leading index.

    Computed in O(n d) over the non-padded queries and keys. ``q (..., n_q, d)``, ``k (..., n_k, d)`` ->
    ``(...)``.
    """
    q_sq = masked_mean(q.pow(2).sum(-1, keepdim=True), query_mask).squeeze(-1)
    k_sq = masked_mean(k.pow(2).sum(-1, keepdim=True), key_mask).squeeze(-1)
    cross = (masked_mean(q, query_mask) * masked_mean(k, key_mask)).sum(-1)
    return q_sq + k_sq + 2 * cross


@register("oprf")
class OPRF(FeatureMap):
    """Optimized positive random features (Eq. 21 with ``s = +1`` and the ``A`` of Eq. 22).

    ``u = ||x + y||^2`` in Eq. 22 is a per-pair quantity; one ``A`` per batch element and head is computed
    from the mean of ``||q_i + k_j||^2`` over all (non-padded) query-key pairs of the sequence, detached
    from the graph. Given the inputs, the estimate is unbiased for every ``A``.
    """

    positive = True

    def running_statistics_defaults(self) -> dict[str, torch.Tensor]:
        """``A = 0`` (PosRF) until the first update."""
        return {"a": torch.zeros(())}

    def statistics(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        query_mask: torch.Tensor | None,
        key_mask: torch.Tensor | None,
    ) -> dict[str, torch.Tensor]:
        """``{"a": A}`` with ``A (...)`` from [`oprf_optimal_a`][rf_features.oprf_optimal_a]."""
        return {"a": oprf_optimal_a(mean_pair_sqnorm(q, k, query_mask, key_mask), self.dim)}

    def log_features(
        self, projection: torch.Tensor, sqnorm: torch.Tensor, stats: dict[str, torch.Tensor], is_query: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """GERF features with ``s = +1`` and the data-dependent ``A``."""
        omega_sqnorm = self.omega_sqnorm(projection.dtype, stats)
        return gerf_log_features(projection, sqnorm, omega_sqnorm, stats["a"], 1, self.dim)

    def log_form(self, matrix: torch.Tensor, stats: dict[str, torch.Tensor], is_query: bool) -> LogForm:
        """GERF's closed form with ``s = +1`` and the data-dependent ``A``."""
        return gerf_log_form(matrix, self.omega_sqnorm(matrix.dtype, stats), stats["a"], 1, self.dim)


def saderf_psi(
    q: torch.Tensor,
    k: torch.Tensor,
    query_mask: torch.Tensor | None,
    key_mask: torch.Tensor | None,
    eps: float = 1e-12,
) -> torch.Tensor:
    r"""SADERF's diagonal $\Psi$ (Eq. 23), optimal over all (non-padded) query-key pairs, ``(..., d)``.

    $\Psi$ minimizes $L = \sum_{i,j} \lVert \Psi q_i + \Psi^{-1} k_j \rVert^2$ over the $n_q$ queries and
    $n_k$ keys left after padding. $(\Psi q_i)^\top \Psi^{-1} k_j = q_i^\top k_j$, so per coordinate $l$
    $L = n_k \psi_l^2 \sum_i q_{il}^2 + n_q \psi_l^{-2} \sum_j k_{jl}^2 + \text{const}$, minimized at
    $\psi_l = (\operatorname{mean}_j k_{jl}^2 / \operatorname{mean}_i q_{il}^2)^{1/4}$: Eq. 23's ratio of
    sums when $n_q = n_k$ (the
    paper's self-attention), the ratio of means otherwise. ``eps`` keeps empty or all-zero coordinates
    finite.
    """
    q_sq = masked_mean(q.pow(2), query_mask)
    k_sq = masked_mean(k.pow(2), key_mask)
    return ((k_sq + eps) / (q_sq + eps)) ** 0.25


@register("saderf")
class SADERF(OPRF):
    r"""Simplified asymmetric dense-exponential random features (Eq. 23, Likhosherstov et al. 2023).

    Queries become $\Psi q$ and keys $\Psi^{-1} k$ with the diagonal $\Psi$ of
    [`saderf_psi`][rf_features.saderf_psi], which leaves $q^\top k$ (so the softmax kernel) unchanged and
    balances their per-coordinate scales; then OPRF (GERF with the optimal $A$ of Eq. 22, from the norms of
    the *transformed* inputs) is applied. ``kernel="gaussian"`` multiplies by
    $\exp(-\lVert q \rVert^2/2 - \lVert k \rVert^2/2)$ of the original inputs.
    """

    def running_statistics_defaults(self) -> dict[str, torch.Tensor]:
        """``Psi = I`` and ``A = 0`` until the first update."""
        return {"psi": torch.ones(self.dim), "a": torch.zeros(())}

    def statistics(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        query_mask: torch.Tensor | None,
        key_mask: torch.Tensor | None,
    ) -> dict[str, torch.Tensor]:
        """``{"psi": Psi (..., d), "a": A (...)}``."""
        psi = saderf_psi(q, k, query_mask, key_mask)
        tq, tk = q * psi.unsqueeze(-2), k / psi.unsqueeze(-2)
        return {"psi": psi, "a": oprf_optimal_a(mean_pair_sqnorm(tq, tk, query_mask, key_mask), self.dim)}

    def input_scale(self, stats: dict[str, torch.Tensor], is_query: bool) -> torch.Tensor:
        """``diag(Psi)`` for queries, ``diag(Psi^-1)`` for keys, ``(..., d)``."""
        return stats["psi"] if is_query else 1 / stats["psi"]
