"""Device choice: ``"auto" | "cpu" | "cuda[:i]"`` as a ``torch.device``, one rule for demos and apps."""

from __future__ import annotations

import torch

DEVICES = ("auto", "cpu", "cuda")
"""The device names accepted (``cuda:<i>`` too)."""


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """The torch device for ``device``: ``auto`` is CUDA when one is available, else the CPU.

    Raises:
        ValueError: an unknown name, or CUDA asked for on a machine without it (or without that index).
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
