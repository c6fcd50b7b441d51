"""The resumable, seeded batch order of the apps' training loops."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


def stream_seed(seed: int, index: int) -> int:
    """The seed of stream ``index`` (an epoch, a step) of a run seeded ``seed``: ``1_000_003 seed + index``.

    The large prime keeps the streams of neighbouring seeds apart for any realistic number of epochs.
    """
    return 1_000_003 * seed + index


class StepBatches(Sampler[list[int]]):
    """Index lists of the training batches from step ``start_step`` on, forever.

    The global batch of step ``t`` is slice ``t mod E`` of a permutation drawn for epoch ``t // E``
    (``E = n // batch_size`` batches per epoch, the remainder dropped) from a generator seeded with
    [`stream_seed`][app_common.batches.stream_seed] ``(seed, epoch)``; process ``rank`` of ``world_size``
    takes its contiguous share.
    The batch of step ``t`` depends on ``(seed, t)`` alone, so a resumed run sees the batches an unbroken
    one would.

    Raises:
        ValueError: ``batch_size`` larger than ``n`` or not divisible by ``world_size``.
    """

    def __init__(
        self, n: int, batch_size: int, *, seed: int, start_step: int = 0, rank: int = 0, world_size: int = 1
    ) -> None:
        if batch_size > n:
            raise ValueError(f"batch_size: {batch_size} is larger than the training split ({n} examples)")
        if batch_size % world_size:
            raise ValueError(f"batch_size: {batch_size} is not divisible by the {world_size} processes")
        self.n, self.batch_size, self.seed, self.start_step = n, batch_size, seed, start_step
        self.rank, self.world_size = rank, world_size

    def __iter__(self) -> Iterator[list[int]]:
        per_epoch = self.n // self.batch_size
        local = self.batch_size // self.world_size
        epoch, order = -1, None
        step = self.start_step
        while True:
            e, i = divmod(step, per_epoch)
            if e != epoch:
                generator = torch.Generator().manual_seed(stream_seed(self.seed, e))
                epoch, order = e, torch.randperm(self.n, generator=generator)
            assert order is not None  # set on the first pass: epoch starts at -1
            batch = order[i * self.batch_size : (i + 1) * self.batch_size]
            yield batch[self.rank * local : (self.rank + 1) * local].tolist()
            step += 1
