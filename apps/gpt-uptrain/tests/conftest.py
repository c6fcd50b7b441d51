"""Tiny corpora and a tiny training configuration for the gpt-uptrain tests."""

import dataclasses
import sys

import pytest
import torch

from gpt_uptrain import GPTConfig, TrainConfig, prepare

# Tiny models: one thread is fastest, and on a shared CPU more threads spin against each other.
torch.set_num_threads(1)

TEXT = "the quick brown fox jumps over the lazy dog. " * 40 + "pack my box with five dozen liquor jugs. " * 40


#: A 2-block model of width 32 (the data decides the vocabulary).
TINY_MODEL = GPTConfig(block_size=16, n_layer=2, n_head=2, n_embd=32, features=24, seed=0)
MODEL_FIELDS = {f.name for f in dataclasses.fields(GPTConfig)}


def tiny_config(tmp_path, data, **overrides):
    """A few steps of a tiny run; ``overrides`` may name GPTConfig fields (``layer="ralimp"``) too."""
    model = {k: overrides.pop(k) for k in list(overrides) if k in MODEL_FIELDS}
    settings = {
        "data": data,
        "out": tmp_path / "run",
        "results": tmp_path / "results.jsonl",
        "model": dataclasses.replace(TINY_MODEL, **model),
        "batch_size": 4,
        "gradient_accumulation_steps": 2,
        "steps": 6,
        "warmup_steps": 1,
        "lr": 3e-3,
        "min_lr": 3e-4,
        "eval_every": 3,
        "eval_batches": 2,
        "log_every": 1,
        "device": "cpu",
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
