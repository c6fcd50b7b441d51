"""Tiny data folders in every real format the package reads, written by the tests themselves."""

import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

# ListOps lines of the release format with their values, checked by hand:
# [MAX 2 9] = 9; [MIN 3 [MAX 1 0] 5] = 1; [MED 1 2] = int(1.5) = 1; [SM 8 7 9] = 24 % 10 = 4.
LISTOPS_LINES = [
    ("( ( ( [MAX 2 ) 9 ) ] )", 9),
    ("( ( ( ( [MIN 3 ) ( ( ( [MAX 1 ) 0 ) ] ) ) 5 ) ] )", 1),
    ("( ( ( [MED 1 ) 2 ) ] )", 1),
    ("( ( ( ( [SM 8 ) 7 ) 9 ) ] )", 4),
]


def write_listops_release(root: Path) -> Path:
    folder = root / "lra_release" / "listops-1000"
    folder.mkdir(parents=True)
    splits = {"train": LISTOPS_LINES, "val": LISTOPS_LINES[:2], "test": LISTOPS_LINES[2:]}
    for split, lines in splits.items():
        text = "Source\tTarget\n" + "".join(f"{source}\t{label}\n" for source, label in lines)
        (folder / f"basic_{split}.tsv").write_text(text)
    return folder


RETRIEVAL_ROWS = [
    ("1", "acl/P01", "acl/P02", "Graph parsing.", "Parsing graphs, fast."),
    ("0", "acl/P03", "acl/P04", "He said \"no\" 'quotes' stay", "caf\u00e9 \u2013 bytes"),
    ("1.0", "acl/P05", "acl/P06", "x", "y"),
]


def write_retrieval_release(root: Path) -> Path:
    folder = root / "lra_release" / "tsv_data"
    folder.mkdir(parents=True)
    for name in ("train", "eval", "test"):
        lines = ["\t".join(row) for row in RETRIEVAL_ROWS]
        (folder / f"new_aan_pairs.{name}.tsv").write_bytes(("\n".join(lines) + "\n").encode())
    return folder


IMDB_REVIEWS = {
    ("train", "neg"): {"10_2.txt": "Bad.<br />Really.", "2_1.txt": "Awful"},
    ("train", "pos"): {"3_9.txt": "Gr\u00e9at!"},
    ("test", "neg"): {"0_3.txt": "meh"},
    ("test", "pos"): {"1_10.txt": "wonderful " * 3},
}


def write_imdb(root: Path) -> Path:
    folder = root / "aclImdb"
    for (split, polarity), files in IMDB_REVIEWS.items():
        (folder / split / polarity).mkdir(parents=True)
        for name, text in files.items():
            (folder / split / polarity / name).write_text(text, encoding="utf-8")
    return folder


def cifar_batch(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    data[0] = 0  # an all-black image: its pixels must not become padding
    return {b"batch_label": b"test", b"labels": [int(v) for v in rng.integers(0, 10, size=n)], b"data": data}


def write_cifar(root: Path, per_batch: int = 2) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for i, name in enumerate([*(f"data_batch_{k}" for k in range(1, 6)), "test_batch"]):
        with (folder / name).open("wb") as f:
            pickle.dump(cifar_batch(per_batch, seed=i), f)
    return folder


def write_pathfinder_release(root: Path, count: int = 20, size: int = 32) -> Path:
    folder = root / "lra_release" / "pathfinder32" / "curv_contour_length_14"
    (folder / "metadata").mkdir(parents=True)
    rng = np.random.default_rng(0)
    lines = {0: [], 1: []}
    for i in range(count):
        sub = f"imgs/{i % 2}"
        (folder / sub).mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, size=(size, size), dtype=np.uint8)
        pixels[0, 0] = 0
        Image.fromarray(pixels).save(folder / sub / f"sample_{i}.png")
        # Fields as in the release: folder, file name, an index, the label, then curve parameters.
        lines[i % 2].append(f"{sub} sample_{i}.png {i} {i % 3 % 2} 14 1.5 1.0 38 5 0.5")
    for k, rows in lines.items():
        (folder / "metadata" / f"{k}.npy").write_text("\n".join(rows) + "\n")
    return folder


def write_pickles(root: Path, task: str, items: dict[str, list[dict]]) -> Path:
    folder = root / "pickles"
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in items.items():
        with (folder / f"{task}.{split}.pickle").open("wb") as f:
            pickle.dump(rows, f)
    return folder


class SystemCall:
    """Pickles as ``os.system(command)``: what a crafted data file runs when it is loaded."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.fixture
def listops_release(tmp_path):
    return write_listops_release(tmp_path)


@pytest.fixture
def retrieval_release(tmp_path):
    return write_retrieval_release(tmp_path)


@pytest.fixture
def imdb(tmp_path):
    return write_imdb(tmp_path)


@pytest.fixture
def cifar(tmp_path):
    return write_cifar(tmp_path)


@pytest.fixture
def pathfinder_release(tmp_path):
    return write_pathfinder_release(tmp_path)


@pytest.fixture
def lra_files():
    """This module: the writers and the expected contents, for tests that need them."""
    return sys.modules[__name__]
