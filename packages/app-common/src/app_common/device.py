"""Device and precision choice: ``--device auto|cpu|cuda[:i]`` and ``--dtype float32|bfloat16``."""

from __future__ import annotations

import contextlib

import torch

DEVICES = ("auto", "cpu", "cuda")
"""The values ``--device`` takes (``cuda:<i>`` is accepted too)."""

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
"""``--dtype`` name -> the dtype that autocast computes in (``float32``: no autocast)."""


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """The torch device for ``device``: ``auto`` is CUDA when one is available, else the CPU.

    Raises:
        ValueError: an unknown name, or ``cuda`` asked for on a machine without CUDA.
    """
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"device: expected one of {', '.join(DEVICES)} or cuda:<index>, got {device!r}")
    resolved = torch.device(device)
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device!r} asked for, but torch sees no CUDA device here")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(
                f"device: {device!r} asked for, but there are {torch.cuda.device_count()} CUDA devices"
            )
    return resolved


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype for a ``--dtype`` name.

    Raises:
        ValueError: a name not in :data:`DTYPES`.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def autocast(device: torch.device, dtype: str | torch.dtype) -> contextlib.AbstractContextManager:
    """Mixed precision for the forward pass: ``torch.autocast`` for bfloat16, nothing for float32.

    Parameters stay float32 (the optimizer updates float32 weights); matrix products run in ``dtype``.
    Code that must accumulate in float32 under autocast (e.g. kernelized attention) casts itself.
    """
    dtype = resolve_dtype(dtype)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
