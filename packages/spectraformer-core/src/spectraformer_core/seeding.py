"""Where a part's randomness comes from: an explicit ``torch.Generator`` or a ``seed``."""

from __future__ import annotations

import torch


def make_generator(seed: int | None, generator: torch.Generator | None) -> torch.Generator:
    """The generator a part draws from.

    ``generator`` is used as it is; else a CPU generator seeded with ``seed``; else a CPU generator seeded
    from the global torch RNG (so ``torch.manual_seed`` makes unseeded draws reproducible too). Drawing on
    the CPU in float64 and moving the result makes the same seed give the same draw on every device.

    Raises:
        ValueError: both ``seed`` and ``generator`` given.
    """
    if generator is not None:
        if seed is not None:
            raise ValueError("seed, generator: pass at most one of them")
        return generator
    if seed is None:
        seed = int(torch.randint(0, 2**62, ()).item())
    return torch.Generator().manual_seed(seed)
