"""``gpt-uptrain sample``: text from a run's ``checkpoint.pt`` or from a local Hugging Face GPT-2 folder.

A checkpoint brings its model (replaced MLPs, its attention) and its tokenizer. An HF folder is loaded as
GPT-2 with ``--attention`` (any causal ``rf_attention`` name; its ``qkv``/``proj`` take the pretrained
``c_attn``/``c_proj``, the feature map starts fresh) and the GPT-2 tokenizer (or ``--tokenizer``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from app_common.device import resolve_device
from gpt_uptrain.config import SampleConfig
from gpt_uptrain.data import TOKENIZERS
from gpt_uptrain.model import GPT
from gpt_uptrain.train import load_model


def load_for_sampling(config: SampleConfig, device: torch.device) -> tuple[GPT, object]:
    """The model and tokenizer that ``config.checkpoint`` names.

    Raises:
        ValueError: ``--attention`` given with a run checkpoint (its attention is the trained one).
        FileNotFoundError: nothing at the path.
    """
    path = Path(config.checkpoint)
    if not path.exists():
        raise FileNotFoundError(
            f"checkpoint: no file or folder at {path} (expected a run's checkpoint.pt or a Hugging Face "
            "folder)"
        )
    if path.is_dir():
        model = GPT.from_pretrained(path, attention=config.attention or "softmax", seed=config.seed).to(
            device
        )
        return model, TOKENIZERS.get(config.tokenizer)()
    if config.attention is not None:
        raise ValueError(
            f"attention: {path} is a run checkpoint, which runs with the attention it was trained with; "
            "--attention applies to Hugging Face folders"
        )
    model, meta = load_model(path, device)
    return model, TOKENIZERS.get(meta["tokenizer"])(meta=meta)


def sample(config: SampleConfig) -> list[str]:
    """``num_samples`` continuations of ``prompt`` (the prompt included)."""
    device = resolve_device(config.device)
    model, tokenizer = load_for_sampling(config, device)
    model.eval()
    ids = tokenizer.encode(config.prompt)
    if not ids:
        raise ValueError("prompt: expected at least one token")
    generator = torch.Generator(device=device).manual_seed(config.seed)
    x = torch.tensor([ids] * config.num_samples, dtype=torch.long, device=device)
    y = model.generate(
        x, config.max_new_tokens, temperature=config.temperature, top_k=config.top_k, generator=generator
    )
    return [tokenizer.decode(row.tolist()) for row in y]
