"""Checkpoint files in the safetensors format, read and written by the ``safetensors`` package.

The package is the format's reference: a file is memory-mapped, and only the tensors asked for are
read (``keys``), so a folder's checkpoint that holds more than a model needs (a classifier head, a pooler)
costs only what is kept. The apps load pretrained checkpoints (GPT-2, ViT) in this format.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file


def read_safetensors(
    path: str | Path, *, keys: Callable[[str], bool] | None = None
) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file, on the CPU (every one, or those whose name ``keys`` keeps).

    Raises:
        ValueError: a file not in that format, a truncated file or an unsupported dtype, naming the path.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such safetensors file")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            names = handle.keys()  # the header only: no tensor is read yet
            return {name: handle.get_tensor(name) for name in names if keys is None or keys(name)}
    except (SafetensorError, OSError, TypeError) as error:
        raise ValueError(f"{path}: not a readable safetensors file ({error})") from None


def write_safetensors(
    path: str | Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> Path:
    """Write ``tensors`` as a ``.safetensors`` file (metadata ``{"format": "pt"}`` by default); the path.

    The tensors are copied to the CPU and made contiguous; two that share memory are both written.
    """
    path = Path(path)
    plain = {name: tensor.detach().cpu().contiguous().clone() for name, tensor in tensors.items()}
    save_file(plain, str(path), metadata=dict(metadata or {"format": "pt"}))
    return path
