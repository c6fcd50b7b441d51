"""The safetensors file format, read and written without the ``safetensors`` package.

A file is an 8-byte little-endian header length, a JSON header
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`` and the raw
little-endian tensor bytes. The apps load pretrained checkpoints (GPT-2, ViT) in this format.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import torch

#: safetensors dtype codes -> torch dtypes.
SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a ``.safetensors`` file, on the CPU.

    Raises:
        ValueError: a file not in that format, a truncated file or an unknown dtype, naming the path.
    """
    path = Path(path)
    data = path.read_bytes()
    try:
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + length])
    except (struct.error, ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not a safetensors file ({error})") from None
    body = memoryview(data)[8 + length :]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry.get("dtype") not in SAFETENSORS_DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {entry.get('dtype')!r}")
        dtype = SAFETENSORS_DTYPES[entry["dtype"]]
        start, end = entry["data_offsets"]
        if not 0 <= start <= end <= len(body):
            raise ValueError(f"{path}: tensor {name!r} runs past the end of the file (truncated?)")
        chunk = bytearray(body[start:end])
        flat = torch.frombuffer(chunk, dtype=dtype) if chunk else torch.empty(0, dtype=dtype)
        tensors[name] = flat.reshape(entry["shape"])
    return tensors


def write_safetensors(
    path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> Path:
    """Write ``tensors`` as a ``.safetensors`` file (the header padded to 8 bytes); returns the path."""
    codes = {v: k for k, v in SAFETENSORS_DTYPES.items()}
    header: dict[str, Any] = {"__metadata__": metadata or {"format": "pt"}}
    blobs, offset = [], 0
    for name, tensor in tensors.items():
        tensor = tensor.detach().cpu().contiguous()
        blob = tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        header[name] = {
            "dtype": codes[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path = Path(path)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))
    return path
