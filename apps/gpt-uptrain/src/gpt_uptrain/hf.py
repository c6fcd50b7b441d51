"""Files of a local Hugging Face GPT-2 checkpoint: ``config.json`` and the weights file.

The weights are ``model.safetensors`` or ``pytorch_model.bin``.

No ``transformers`` is needed: ``app_common.safetensors.read_safetensors`` and ``write_safetensors`` handle
the safetensors format (through the ``safetensors`` package, memory-mapped), and ``pytorch_model.bin`` is read
with ``torch.load(weights_only=True)``. Nothing is downloaded: point ``--weights`` at a folder written by
``save_pretrained`` or a hub snapshot already on disk.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from app_common.safetensors import read_safetensors, write_safetensors

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
            f"weights: {path} is no Hugging Face checkpoint folder (expected {file} and one of "
            f"{', '.join(WEIGHT_FILES)})"
        )
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{file}: not valid JSON ({error.msg})") from None


def gpt2_config_fields(config: dict) -> dict:
    """The [`GPTConfig`][gpt_uptrain.GPTConfig] shape fields of an HF GPT-2 ``config.json``.

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
    raise FileNotFoundError(f"weights: {path} holds none of {', '.join(WEIGHT_FILES)}")


def save_pretrained(model, path: str | Path) -> Path:
    """Write a dense [`GPT`][gpt_uptrain.GPT] as an HF GPT-2 folder.

    The folder gets ``config.json`` and ``model.safetensors``.

    The tied ``lm_head.weight`` is left out of the file, as ``transformers`` does.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model.hf_config(), indent=2) + "\n", encoding="utf-8")
    state = {k: v for k, v in model.hf_state_dict().items() if k != "lm_head.weight"}
    write_safetensors(path / "model.safetensors", state)
    return path
