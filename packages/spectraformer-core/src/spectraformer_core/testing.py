"""What the tests of every package share: the relative-error comparison, seeded draws, a thread count.

The comparison in the style of flash-linear-attention's tests: one number per comparison, the norm of the
difference over the norm of the reference, so a tolerance means the same at every shape and scale, and a
failure says how far off the result is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def relative_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    """``||actual - reference|| / ||reference||`` in float64 (Frobenius norms over all elements).

    Args:
        actual: the result, any shape, on any device (it is compared on the reference's device).
        reference: what it should be, the same shape.

    Returns:
        The relative error; ``||actual||`` when the reference is all zeros (so 0 when both are), and NaN
        when either holds a NaN.

    Raises:
        ValueError: the shapes differ (broadcasting would hide a wrong shape).
    """
    if actual.shape != reference.shape:
        raise ValueError(
            f"actual: expected the shape of reference {tuple(reference.shape)}, got {tuple(actual.shape)}"
        )
    reference = reference.detach().double()
    actual = actual.detach().to(device=reference.device, dtype=torch.float64)
    scale = torch.linalg.vector_norm(reference)
    difference = torch.linalg.vector_norm(actual - reference)
    return float(difference / scale) if scale > 0 else float(torch.linalg.vector_norm(actual))


def assert_rel_close(name: str, reference: torch.Tensor, actual: torch.Tensor, ratio: float) -> None:
    """Assert that ``actual`` is within relative error ``ratio`` of ``reference``.

    Args:
        name: what is compared, for the failure message (``"output"``, ``"dq float32"``).
        reference: the plain or exact form's result.
        actual: the result under test, the same shape.
        ratio: the largest allowed [`relative_error`][spectraformer_core.testing.relative_error].

    Raises:
        AssertionError: the relative error exceeds ``ratio`` or is NaN; the message gives both numbers and
            the reference's norm, e.g. ``output: relative error 3.1e-02 > tolerance 1.0e-02
            (||reference|| = 4.2, shape (2, 8))``.
    """
    error = relative_error(actual, reference)
    if not error <= ratio:  # also NaN
        scale = float(torch.linalg.vector_norm(reference.detach().double()))
        raise AssertionError(
            f"{name}: relative error {error:.1e} > tolerance {ratio:.1e} "
            f"(||reference|| = {scale:.3g}, shape {tuple(reference.shape)})"
        )


def seeded_randn(
    *shape: int, seed: int = 0, scale: float = 1.0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``scale`` times standard-normal draws of ``shape`` from their own generator seeded by ``seed``.

    The same ``seed`` gives the same tensor whatever ran before (the global RNG is not touched).
    """
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype) * scale


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(count)``; the previous count is restored after it.

    Loops of tiny operations (token-by-token decoding, operation counts) are fastest on one thread.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
