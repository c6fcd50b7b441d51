"""Files of a local Hugging Face GPT-2 checkpoint: ``config.json`` and the weights file.

The weights are ``model.safetensors`` or ``pytorch_model.bin``.

No ``transformers`` and no ``safetensors`` package are needed: the safetensors format is an 8-byte
little-endian header length, a JSON header ``{name: {"dtype", "shape", "data_offsets": [begin, end]}}`` and
the raw little-endian tensor bytes, which :func:`read_safetensors` and :func:`write_safetensors` handle in a
few lines. ``pytorch_model.bin`` is read with ``torch.load(weights_only=True)``. Nothing is downloaded: point
``--init-from`` at a folder written by ``save_pretrained`` or a hub snapshot already on disk.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

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

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def read_config(path: str | Path) -> dict:
    """The ``config.json`` of the checkpoint folder ``path``.

    Raises:
        FileNotFoundError: no folder or no ``config.json``, naming the path.
        ValueError: not valid JSON.
    """
    path = Path(path)
    file = path / "config.json"
    if not file.is_file():
        raise FileNotFoundError(
            f"init_from: {path} is no Hugging Face checkpoint folder (expected {file} and one of "
            f"{', '.join(WEIGHT_FILES)})"
        )
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{file}: not valid JSON ({error.msg})") from None


def gpt2_config_fields(config: dict) -> dict:
    """The :class:`~gpt_uptrain.model.GPTConfig` shape fields of an HF GPT-2 ``config.json``.

    Raises:
        ValueError: a ``model_type`` other than ``gpt2``, a missing key, or an unsupported setting
            (``n_inner`` other than ``4 n_embd``, an activation other than GELU).
    """
    if config.get("model_type", "gpt2") != "gpt2":
        raise ValueError(f"config.json: model_type {config.get('model_type')!r} is not 'gpt2'")
    try:
        fields = {
            "vocab_size": int(config["vocab_size"]),
            "block_size": int(config.get("n_positions", config.get("n_ctx"))),
            "n_layer": int(config["n_layer"]),
            "n_head": int(config["n_head"]),
            "n_embd": int(config["n_embd"]),
            "layer_norm_epsilon": float(config.get("layer_norm_epsilon", 1e-5)),
            "bias": True,
        }
    except (KeyError, TypeError) as error:
        raise ValueError(f"config.json: missing or bad GPT-2 key ({error})") from None
    if config.get("n_inner") not in (None, 4 * fields["n_embd"]):
        raise ValueError(f"config.json: n_inner={config['n_inner']} is not 4 * n_embd, which this model has")
    activation = config.get("activation_function", "gelu_new")
    if "gelu" not in activation:
        raise ValueError(
            f"config.json: activation_function {activation!r} is not a GELU, which this model has"
        )
    return fields


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a ``.safetensors`` file.

    Raises:
        ValueError: a truncated file, a bad header or an unknown dtype, naming the path.
    """
    path = Path(path)
    data = path.read_bytes()
    try:
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + length])
    except (struct.error, json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not a safetensors file ({error})") from None
    body = memoryview(data)[8 + length :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in SAFETENSORS_DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']!r}")
        begin, end = info["data_offsets"]
        if end > len(body):
            raise ValueError(f"{path}: tensor {name!r} runs past the end of the file (truncated?)")
        dtype = SAFETENSORS_DTYPES[info["dtype"]]
        chunk = bytearray(body[begin:end])
        tensor = torch.frombuffer(chunk, dtype=dtype) if chunk else torch.empty(0, dtype=dtype)
        out[name] = tensor.reshape(info["shape"])
    return out


def write_safetensors(
    path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict | None = None
) -> Path:
    """Write ``tensors`` (contiguous, CPU) as a ``.safetensors`` file; the header is padded to 8 bytes."""
    codes = {v: k for k, v in SAFETENSORS_DTYPES.items()}
    header: dict = {"__metadata__": metadata or {"format": "pt"}}
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


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The weights of the folder ``path`` (``model.safetensors`` first, else ``pytorch_model.bin``).

    Raises:
        FileNotFoundError: neither file exists (sharded checkpoints are not supported: GPT-2 fits
            in one file).
    """
    path = Path(path)
    if (path / "model.safetensors").is_file():
        return read_safetensors(path / "model.safetensors")
    if (path / "pytorch_model.bin").is_file():
        return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"init_from: {path} holds none of {', '.join(WEIGHT_FILES)}")


def save_pretrained(model, path: str | Path) -> Path:
    """Write a dense :class:`~gpt_uptrain.model.GPT` as an HF GPT-2 folder.

    The folder gets ``config.json`` and ``model.safetensors``.

    The tied ``lm_head.weight`` is left out of the file, as ``transformers`` does.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model.hf_config(), indent=2) + "\n", encoding="utf-8")
    state = {k: v for k, v in model.hf_state_dict().items() if k != "lm_head.weight"}
    write_safetensors(path / "model.safetensors", state)
    return path
