"""Timing (an accumulating timer, median timers), peak memory and parameter counts.

Peak memory is the CUDA allocator's peak on GPUs and the peak resident set size on the CPU.
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from spectraformer_core import check_int


class Timer:
    """Accumulating wall-clock timer (``time.perf_counter``); waits for CUDA work before reading the clock.

    ``with timer: ...`` adds the block's duration to `elapsed`; ``Timer(elapsed=t)`` continues a
    total saved earlier (a resumed run).

    Args:
        device: the device whose queued work must finish before the clock is read (CUDA only).
        elapsed: seconds already counted.
    """

    def __init__(self, device: torch.device | None = None, elapsed: float = 0.0) -> None:
        self.device = device
        self.elapsed = float(elapsed)
        self._start: float | None = None

    def _sync(self) -> None:
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def start(self) -> None:
        """Start (or restart) counting."""
        self._sync()
        self._start = time.perf_counter()

    def stop(self) -> float:
        """Stop counting; returns the total `elapsed` seconds."""
        if self._start is None:
            raise RuntimeError("Timer.stop: the timer is not running; call start() first")
        self._sync()
        self.elapsed += time.perf_counter() - self._start
        self._start = None
        return self.elapsed

    @property
    def running_total(self) -> float:
        """Seconds counted so far, including the running interval (no synchronization)."""
        extra = 0.0 if self._start is None else time.perf_counter() - self._start
        return self.elapsed + extra

    def __enter__(self) -> Timer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class PeakMemory:
    """A peak memory reading.

    Attributes:
        bytes: the peak in bytes.
        kind: ``cuda_max_allocated`` (``torch.cuda.max_memory_allocated`` since the last reset: tensors
            only, per device) or ``cpu_peak_rss`` (the process's peak resident set size since it started,
            ``getrusage``: everything the process touched, including Python and libraries; it cannot be
            reset, so run one measurement per process).
    """

    bytes: int
    kind: str


def reset_peak_memory(device: torch.device) -> None:
    """Start a new CUDA peak (``torch.cuda.reset_peak_memory_stats``); nothing to do on the CPU."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> PeakMemory:
    """The peak memory of ``device`` (see [`PeakMemory`][app_common.PeakMemory] for what each kind counts)."""
    if device.type == "cuda":
        return PeakMemory(int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kibibytes, macOS bytes.
    return PeakMemory(int(rss if sys.platform == "darwin" else rss * 1024), "cpu_peak_rss")


def _synchronize(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(
    fn: Callable[[], object],
    *,
    repeats: int,
    warmup: int = 1,
    device: torch.device | None = None,
    setup: Callable[[], object] | None = None,
) -> float:
    """Median wall time of ``fn()`` in seconds over ``repeats`` calls, after ``warmup`` uncounted ones.

    Args:
        fn: the work.
        repeats: counted calls (>= 1).
        warmup: uncounted calls first.
        device: CUDA work queued on it is waited for before each clock reading.
        setup: called before every call, outside the clock (e.g. clearing gradients).
    """
    return interleaved_medians({"fn": fn}, repeats=repeats, warmup=warmup, device=device, setup=setup)["fn"]


def interleaved_medians(
    fns: Mapping[str, Callable[[], object]],
    *,
    repeats: int,
    warmup: int = 1,
    device: torch.device | None = None,
    setup: Callable[[], object] | None = None,
) -> dict[str, float]:
    """Median seconds of each ``fns[name]()``, the functions interleaved in every round.

    Interleaving makes the ratios between them robust to a load that drifts during the measurement (a
    shared CPU): every round times each function once. ``warmup`` rounds are not counted.

    Raises:
        ValueError: ``repeats`` < 1.
    """
    check_int("repeats", repeats, 1)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(warmup + repeats):
        for name, fn in fns.items():
            if setup is not None:
                setup()
            _synchronize(device)
            start = time.perf_counter()
            fn()
            _synchronize(device)
            if round_ >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def count_parameters(model: torch.nn.Module, *, trainable: bool = True) -> int:
    """Parameters of ``model`` (``trainable``: only those with ``requires_grad``; buffers never count)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable)
