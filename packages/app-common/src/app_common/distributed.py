"""DistributedDataParallel set-up from the environment ``torchrun`` sets, and its teardown.

``torchrun --nproc_per_node N -m app ...`` starts ``N`` processes with ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set;
[`setup_distributed`][app_common.distributed.setup_distributed]
joins the process group (``nccl`` on CUDA, ``gloo`` on the CPU) and gives each process its device. Started
without ``torchrun``, it returns a one-process context and the same code runs unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from app_common.device import autocast, resolve_device

T = TypeVar("T")

_TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


@dataclass(frozen=True)
class Distributed:
    """Where this process stands in a (possibly one-process) data-parallel run.

    Attributes:
        rank: global rank, 0 .. world_size - 1.
        local_rank: rank on this machine (the CUDA device index under ``nccl``).
        world_size: number of processes.
        device: this process's device.
        backend: ``nccl``, ``gloo``, or None when there is no process group.
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        """True on rank 0: the process that writes results, checkpoints and progress bars."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        """True when a process group is set up (``world_size > 1`` under ``torchrun``)."""
        return self.backend is not None


def launched_by_torchrun() -> bool:
    """True when ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` are in the environment."""
    return all(name in os.environ for name in _TORCHRUN_VARIABLES)


def setup_distributed(device: str | torch.device = "auto") -> Distributed:
    """Join the process group that ``torchrun`` describes, or return a one-process context.

    Under ``torchrun`` with CUDA, process ``local_rank`` uses ``cuda:<local_rank>`` and ``nccl``; on the
    CPU every process uses ``gloo``. A world of size 1 sets up no process group.

    Args:
        device: ``auto``, ``cpu`` or ``cuda`` (see `resolve_device`); under ``torchrun``
            a CUDA device index is replaced by ``LOCAL_RANK``.

    Raises:
        ValueError: a bad device, or ``torchrun`` variables that are not integers.
    """
    resolved = resolve_device(device)
    if not launched_by_torchrun():
        return Distributed(device=resolved)
    try:
        rank, local_rank, world_size = (int(os.environ[name]) for name in _TORCHRUN_VARIABLES)
    except ValueError:
        values = {name: os.environ[name] for name in _TORCHRUN_VARIABLES}
        raise ValueError(f"torchrun environment: expected integers, got {values}") from None
    if resolved.type == "cuda":
        resolved = torch.device("cuda", local_rank)
        torch.cuda.set_device(resolved)
    if world_size == 1:
        return Distributed(rank, local_rank, 1, resolved, None)
    backend = "nccl" if resolved.type == "cuda" else "gloo"
    if not dist.is_initialized():
        if resolved.type == "cuda":
            dist.init_process_group(backend, device_id=resolved)
        else:
            dist.init_process_group(backend)
    return Distributed(rank, local_rank, world_size, resolved, backend)


def teardown_distributed() -> None:
    """Leave the process group (after a barrier), if one was set up."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """``tensor`` reduced over all processes (``sum``, ``max`` or ``mean``), in place; as is without a group.

    Raises:
        ValueError: an unknown ``op``.
    """
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "mean": dist.ReduceOp.SUM}
    if op not in ops:
        raise ValueError(f"op: expected one of {', '.join(ops)}, got {op!r}")
    if dist.is_initialized():
        dist.all_reduce(tensor, op=ops[op])
        if op == "mean":
            tensor /= dist.get_world_size()
    return tensor


@torch.no_grad()
def evaluation_sums(
    model: torch.nn.Module,
    batches: Iterable[T],
    sums: Callable[[T, Callable[..., Any]], torch.Tensor],
    *,
    size: int,
    device: torch.device,
    dtype: str | torch.dtype,
) -> torch.Tensor:
    """Sums ``(size,)`` float64 of ``sums(batch, forward)`` over this process's batches and all processes.

    ``model`` is in eval mode meanwhile and goes back to the mode it had; ``forward(*inputs)`` calls
    ``model`` under [`autocast`][app_common.device.autocast] (only the forward pass runs in ``dtype``), and
    ``sums`` returns what to add up, e.g. ``(correct, count)``; the caller divides.
    """
    was_training = model.training
    model.eval()

    def forward(*inputs: Any) -> Any:
        with autocast(device, dtype):
            return model(*inputs)

    totals = torch.zeros(size, dtype=torch.float64, device=device)
    for batch in batches:
        totals += sums(batch, forward)
    all_reduce(totals, "sum")
    model.train(was_training)
    return totals


def all_gather_object(obj: T) -> list[T]:
    """``[obj of rank 0, obj of rank 1, ...]``; ``[obj]`` without a process group."""
    if not dist.is_initialized():
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def barrier() -> None:
    """Wait for every process; nothing without a process group."""
    if dist.is_initialized():
        dist.barrier()
