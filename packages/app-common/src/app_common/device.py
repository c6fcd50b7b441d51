"""Device and precision choice: ``--device auto|cpu|cuda[:i]`` and ``--dtype float32|bfloat16``.

``resolve_device`` and ``DEVICES`` are ``spectraformer_core``'s (one rule for the demos and the apps),
re-exported here so that an app finds its device flags in one module.
"""

from __future__ import annotations

import contextlib
import platform
from pathlib import Path

import torch

from spectraformer_core import DEVICES, resolve_device

__all__ = ["DEVICES", "DTYPES", "autocast", "device_name", "resolve_device", "resolve_dtype"]

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
"""``--dtype`` name -> the dtype that autocast computes in (``float32``: no autocast)."""


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype for a ``--dtype`` name.

    Raises:
        ValueError: a name not in [`DTYPES`][app_common.device.DTYPES].
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def autocast(device: torch.device, dtype: str | torch.dtype) -> contextlib.AbstractContextManager[None]:
    """Mixed precision for the forward pass: ``torch.autocast`` for bfloat16, nothing for float32.

    Parameters stay float32 (the optimizer updates float32 weights); matrix products run in ``dtype``.
    Code that must accumulate in float32 under autocast (e.g. kernelized attention) casts itself.
    """
    dtype = resolve_dtype(dtype)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def device_name(device: torch.device) -> str:
    """What a result record says the run ran on: the CUDA device's name, or the CPU's model name.

    The CPU's name is the ``model name`` line of ``/proc/cpuinfo`` where there is one (Linux), else
    ``platform.processor()`` or ``platform.machine()``.
    """
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()
