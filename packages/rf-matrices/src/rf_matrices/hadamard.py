"""Fast Walsh-Hadamard transform, the O(d log d) building block of SORF (Eq. 15) and FastFood (Eq. 13)."""

from __future__ import annotations

import torch


def next_power_of_two(n: int) -> int:
    """Smallest power of two >= ``n`` (``n >= 1``)."""
    return 1 << (n - 1).bit_length()


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Normalized Walsh-Hadamard transform along the last dimension.

    Computes ``x @ H.T`` with ``H = H_n / sqrt(n)`` the orthonormal Sylvester-ordered Hadamard matrix
    (``H_2n = [[H_n, H_n], [H_n, -H_n]]``), in ``log2(n)`` butterfly passes of O(n) each, without
    building H. Differentiable, and works on any device and floating dtype.

    Args:
        x: ``(..., n)`` with ``n`` a power of two.

    Returns:
        ``(..., n)``, the transformed tensor (``fwht(fwht(x)) == x``).
    """
    n = x.shape[-1]
    if n < 1 or n & (n - 1):
        raise ValueError(f"x: last dimension must be a power of two, got {n}")
    lead = x.shape[:-1]
    h = 1
    while h < n:
        pairs = x.reshape(*lead, n // (2 * h), 2, h)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        x = torch.stack((a + b, a - b), dim=-2)
        h *= 2
    return x.reshape(*lead, n) * n**-0.5


def hadamard_matrix(n: int, *, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The dense normalized Sylvester Hadamard matrix ``(n, n)``, the reference :func:`fwht` is tested on."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"n: expected a power of two, got {n}")
    h = torch.ones(1, 1, dtype=dtype)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h * n**-0.5
