"""Checkpoints written atomically, so a run killed at any moment leaves the previous one intact."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` with ``torch.save`` to a temporary file beside ``path``, then rename it over ``path``.

    The rename is atomic on POSIX file systems: readers see the old checkpoint or the new one, never half
    of one. Keep ``state`` to tensors, numbers, strings, lists and dicts so that
    [`load_checkpoint`][app_common.load_checkpoint] reads it with ``weights_only=True``.

    Returns:
        ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_checkpoint(path: str | Path, *, map_location: str | torch.device = "cpu") -> dict[str, Any] | None:
    """The state saved at ``path``, or None when there is no checkpoint there.

    Loads with ``weights_only=True`` (no arbitrary code runs from the file).

    Raises:
        ValueError: the file exists but cannot be read as a checkpoint, naming the path.
    """
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:
        raise ValueError(f"{path}: not a readable checkpoint ({type(error).__name__}: {error})") from error
