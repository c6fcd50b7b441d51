"""Timing (an accumulating timer, median timers), peak memory and parameter counts.

Peak memory is the CUDA allocator's peak on GPUs and the peak resident set size on the CPU, both since the
last reset (`reset_peak_memory`, or a `PeakMemoryMeter` block): the one measure of run records and benchmarks.
"""

from __future__ import annotations

import ctypes
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

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
    """A peak memory reading: the most in use since `reset_peak_memory`.

    Attributes:
        bytes: the peak in bytes.
        kind: ``cuda_max_allocated`` (``torch.cuda.max_memory_allocated``: tensors only, per device),
            ``cpu_peak_rss`` (the process's resident high-water mark ``VmHWM``, reset through
            ``/proc/self/clear_refs`` on Linux: everything the process touched, Python and libraries
            included) or ``cpu_peak_rss_since_start`` (elsewhere: ``getrusage``'s peak since the process
            started, which cannot be reset; run one measurement per process there).
    """

    bytes: int
    kind: str


#: glibc's malloc serves blocks of at least this many bytes by ``mmap`` once the threshold is fixed, and
#: unmaps them when freed, so the resident high-water mark counts the tensors alive at once (glibc otherwise
#: raises the threshold as large blocks are freed, and a freed tensor's pages stay resident for the next).
MMAP_THRESHOLD_BYTES = 128 * 1024
#: ``M_MMAP_THRESHOLD`` of glibc's ``<malloc.h>``, the ``mallopt`` parameter.
_M_MMAP_THRESHOLD = -3


def fix_mmap_threshold(nbytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's malloc mmap threshold of this process at ``nbytes`` (``mallopt``); False where not glibc.

    The same as starting the process with ``MALLOC_MMAP_THRESHOLD_=nbytes``: from then on the CPU peak of a
    [`PeakMemoryMeter`][app_common.measure.PeakMemoryMeter] block counts the tensors (of at least ``nbytes``)
    alive together, not pages that freed tensors left resident.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, nbytes))


#: Linux: writing ``5`` here resets the resident high-water mark (``VmHWM``) to the resident size.
CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_bytes(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return 1024 * int(line.split()[1])
    raise KeyError(f"/proc/self/status has no {field} line")


def _resettable() -> bool:
    """Whether this process may reset its resident high-water mark (Linux, ``clear_refs`` writable)."""
    return os.access(CLEAR_REFS, os.W_OK)


def _process_peak_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports kibibytes, macOS bytes


def reset_peak_memory(device: torch.device) -> int:
    """Start a new peak of ``device``; returns the bytes in use now (the new peak's ``baseline``).

    CUDA: ``torch.cuda.reset_peak_memory_stats`` and the allocated bytes. CPU on Linux: the resident
    high-water mark is reset to the resident size (``/proc/self/clear_refs``); elsewhere nothing can be reset
    and the baseline is the process's peak so far.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        baseline = int(torch.cuda.memory_allocated(device))
    elif _resettable():
        CLEAR_REFS.write_text("5")
        baseline = _status_bytes("VmRSS")
    else:
        baseline = _process_peak_bytes()
    return baseline


def peak_memory(device: torch.device) -> PeakMemory:
    """The peak memory of ``device`` since the last reset (see `PeakMemory`)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return PeakMemory(int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated")
    if _resettable():
        return PeakMemory(_status_bytes("VmHWM"), "cpu_peak_rss")
    return PeakMemory(_process_peak_bytes(), "cpu_peak_rss_since_start")


class PeakMemoryMeter:
    """``with PeakMemoryMeter(device) as meter: ...``: the block's peak (``meter.peak``, ``meter.added``).

    The peak is reset on entry and read on exit, so consecutive blocks each get their own peak (on the CPU,
    where the resident size can be reset: Linux). On the CPU the peak counts pages, not tensors: run with
    glibc's ``MALLOC_MMAP_THRESHOLD_`` fixed (e.g. 131072) so that a freed tensor's pages go back to the
    system at once and the peak counts the tensors alive together.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        #: Bytes in use when the block started (CUDA: allocated tensors; CPU: the resident size).
        self.baseline = 0
        self._peak: PeakMemory | None = None

    def __enter__(self) -> PeakMemoryMeter:
        self._peak = None
        self.baseline = reset_peak_memory(self.device)
        return self

    def __exit__(self, *exc: object) -> None:
        self._peak = peak_memory(self.device)

    @property
    def peak(self) -> PeakMemory:
        """The block's peak (after the ``with`` block)."""
        if self._peak is None:
            raise RuntimeError("PeakMemoryMeter.peak: read it after the with block")
        return self._peak

    @property
    def added(self) -> int:
        """Bytes of the block's peak above its ``baseline``: what the block added at its largest."""
        return self.peak.bytes - self.baseline


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
