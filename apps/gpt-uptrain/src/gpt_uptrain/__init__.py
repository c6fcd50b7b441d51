"""GPT-2 in the style of nanoGPT, trained or uptrained with the MLPs of the last k blocks linearized.

The command ``gpt-uptrain`` (``prepare``, ``train``, ``quick``, ``sample``, ``report``) wraps these:

    from gpt_uptrain import GPT, GPTConfig, TrainConfig, train
    model = GPT(GPTConfig(n_layer=4, n_head=4, n_embd=128, vocab_size=100, layer="ralimp", last_k=2))
    model = GPT.from_pretrained("path/to/gpt2", layer="ralimp", last_k=6)   # local HF checkpoint
    record = train(TrainConfig(data="data/owt", weights="path/to/gpt2",
                               model=GPTConfig(layer="ralimp", last_k=6)))
"""

from gpt_uptrain.config import PrepareConfig, QuickConfig, ReportConfig, SampleConfig, TrainConfig
from gpt_uptrain.data import (
    TOKENIZERS,
    ByteTokenizer,
    CharTokenizer,
    GPT2Tokenizer,
    TokenData,
    prepare,
    stdlib_files,
)
from gpt_uptrain.hf import read_safetensors, read_state_dict, save_pretrained, write_safetensors
from gpt_uptrain.model import GPT, LAYER_OPTIONS, MLP, Block, GPTConfig
from gpt_uptrain.quick import quick
from gpt_uptrain.report import report
from gpt_uptrain.sample import sample
from gpt_uptrain.train import build_model, evaluate, learning_rate, load_model, train

__all__ = [
    "GPT",
    "LAYER_OPTIONS",
    "MLP",
    "TOKENIZERS",
    "Block",
    "ByteTokenizer",
    "CharTokenizer",
    "GPT2Tokenizer",
    "GPTConfig",
    "PrepareConfig",
    "QuickConfig",
    "ReportConfig",
    "SampleConfig",
    "TokenData",
    "TrainConfig",
    "build_model",
    "evaluate",
    "learning_rate",
    "load_model",
    "prepare",
    "quick",
    "read_safetensors",
    "read_state_dict",
    "report",
    "sample",
    "save_pretrained",
    "stdlib_files",
    "train",
    "write_safetensors",
]
