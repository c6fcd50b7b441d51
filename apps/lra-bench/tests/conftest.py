"""Tiny LRA caches written with lra_data's own writer, and a fast configuration for them."""

import sys

import numpy as np
import pytest

import lra_data
from lra_bench import train_config

SIZES = {"train": 48, "val": 16, "test": 16}


def write_cache(root, task, sizes=SIZES, seed=0, examples=None):
    """A cache of random documents for ``task`` (Text without a val split, as in the release)."""
    spec = lra_data.TASK_SPECS[task]
    vocab = spec.tokenization["vocab_size"]
    rng = np.random.default_rng(seed)
    writer = lra_data.CacheWriter(
        root / task,
        task=task,
        num_classes=spec.num_classes,
        max_length=32,
        pair=spec.pair,
        tokenization=spec.tokenization,
        source={"kind": "test"},
    )
    for split, count in sizes.items():
        if task == "text" and split == "val":
            continue

        def doc():
            return rng.integers(1, vocab, size=int(rng.integers(4, 24)))

        items = (
            examples(split, count, rng)
            if examples
            else [
                ((doc(), doc()) if spec.pair else doc(), int(rng.integers(0, spec.num_classes)))
                for _ in range(count)
            ]
        )
        writer.write_split(split, items)
    writer.finish()
    return root


def majority_digit_examples(split, count, rng):
    """An easy task: most tokens are the digit that is the label (ListOps ids: digit d is token 6 + d)."""
    items = []
    for _ in range(count):
        label = int(rng.integers(0, 10))
        length = int(rng.integers(12, 25))
        tokens = np.full(length, 6 + label)
        noise = rng.random(length) < 0.3
        tokens[noise] = rng.integers(1, 16, size=int(noise.sum()))
        items.append((tokens, label))
    return items


#: The fast settings of `tiny_config` (flags of lra-bench train).
TINY_SETTINGS = {
    "attention": "softmax",
    "attention_features": 16,
    "device": "cpu",
    "batch_size": 8,
    "lr": 1e-3,
    "warmup_steps": 2,
    "eval_every": 3,
    "eval_batches": 2,
    "init_steps": 0,
    "max_length": 32,
    "steps": 6,
    "dim": 32,
    "embedding_dim": 32,
    "hidden_dim": 32,
    "log_every": 1,
    "threads": 1,  # tiny models: on a shared 2-core machine more threads only contend
}


def tiny_config(tmp_path, task="listops", **overrides):
    settings = {
        **TINY_SETTINGS,
        "task": task,
        "data": tmp_path / "data",
        "out": tmp_path / "out",
    }
    settings.update(overrides)
    return train_config(settings)


def results(config):
    """The results file of a run."""
    return config.out / "results.jsonl"


def run_dir(config):
    """The checkpoint and log folder of a run."""
    from lra_bench import run_name

    return config.out / "runs" / run_name(config)


@pytest.fixture
def data(tmp_path):
    for task in lra_data.TASKS:
        write_cache(tmp_path / "data", task)
    return tmp_path / "data"


@pytest.fixture
def helpers():
    """This module (tests import it through the fixture: importlib mode puts no test folder on sys.path)."""
    return sys.modules[__name__]
