"""Fast Walsh-Hadamard transform, the O(d log d) building block of SORF (Eq. 15) and FastFood (Eq. 13)."""

from __future__ import annotations

import functools

import torch


def next_power_of_two(n: int) -> int:
    """Smallest power of two >= ``n`` (``n >= 1``)."""
    return 1 << (n - 1).bit_length()


#: Largest Hadamard factor applied as one dense product: the transform runs in radix-32 passes.
RADIX_BITS = 5


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Normalized Walsh-Hadamard transform along the last dimension.

    Computes ``x @ H.T`` with ``H = H_n / sqrt(n)`` the orthonormal Sylvester-ordered Hadamard matrix
    (``H_2n = [[H_n, H_n], [H_n, -H_n]]``) without building H: ``H_n`` is the Kronecker product of
    Sylvester factors of size at most 32, applied one axis at a time as small dense products (a radix-32
    fast transform: ``ceil(log2(n) / 5)`` passes of ``O(32 n)`` each, ``O(n log n)`` overall; on CPUs and
    GPUs small matrix products beat radix-2 butterflies by a wide margin). Differentiable, and works on
    any device and floating dtype.

    Args:
        x: ``(..., n)`` with ``n`` a power of two.

    Returns:
        ``(..., n)``, the transformed tensor (``fwht(fwht(x)) == x``).
    """
    n = x.shape[-1]
    if n < 1 or n & (n - 1):
        raise ValueError(f"x: last dimension must be a power of two, got {n}")
    lead = x.shape[:-1]
    y = x.reshape(-1, n)
    bits = n.bit_length() - 1
    while bits > 0:
        step = min(RADIX_BITS, bits)
        f = 1 << step
        factor = _sylvester(f, x.dtype, x.device)
        # apply H_f on the fastest axis, then move that axis to the front: after every factor has been
        # applied the axes are back in their original order (H_n = H_f1 x ... x H_fr, Sylvester order).
        y = (y.view(y.shape[0], n // f, f) @ factor).transpose(1, 2).reshape(y.shape[0], n)
        bits -= step
    return (y * float(n) ** -0.5).reshape(*lead, n)


@functools.cache
def _sylvester(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The unnormalized (+-1) Sylvester Hadamard matrix ``(n, n)`` (symmetric)."""
    return (hadamard_matrix(n, dtype=dtype) * float(n) ** 0.5).round().to(device)


def hadamard_matrix(n: int, *, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The dense normalized Sylvester Hadamard matrix ``(n, n)``, the reference `fwht` is tested on."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"n: expected a power of two, got {n}")
    h = torch.ones(1, 1, dtype=dtype)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h * float(n) ** -0.5
