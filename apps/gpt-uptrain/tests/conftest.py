"""Tiny corpora and a tiny training configuration for the gpt-uptrain tests."""

import sys

import pytest
import torch

from gpt_uptrain import TrainConfig, prepare

# Tiny models: one thread is fastest, and on a shared CPU more threads spin against each other.
torch.set_num_threads(1)

TEXT = "the quick brown fox jumps over the lazy dog. " * 40 + "pack my box with five dozen liquor jugs. " * 40


def tiny_config(tmp_path, data, **overrides):
    settings = {
        "data": data,
        "out": tmp_path / "run",
        "results": tmp_path / "results.jsonl",
        "n_layer": 2,
        "n_head": 2,
        "n_embd": 32,
        "block_size": 16,
        "batch_size": 4,
        "gradient_accumulation_steps": 2,
        "max_iters": 6,
        "warmup_iters": 1,
        "learning_rate": 3e-3,
        "min_lr": 3e-4,
        "eval_interval": 3,
        "eval_iters": 2,
        "log_interval": 1,
        "mlp_features": 16,
        "device": "cpu",
        "seed": 0,
    }
    settings.update(overrides)
    return TrainConfig(**settings)


@pytest.fixture
def data(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    prepare([corpus], tmp_path / "data", tokenizer="char")
    return tmp_path / "data"


@pytest.fixture
def helpers():
    """This module (tests import it through the fixture: importlib mode puts no test folder on sys.path)."""
    return sys.modules[__name__]
