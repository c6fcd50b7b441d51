"""Readers of the data sets' own file formats, yielding ``(tokens, label)`` examples.

Every reader checks what it reads and raises, naming the file (and line), instead of skipping anything:
[`DataFormatError`][lra_data.DataFormatError] for malformed content, `FileNotFoundError` for a missing
file. Tokens are ``int64`` numpy arrays in the tokenization of [`lra_data.tokenizers`][lra_data.tokenizers],
not yet truncated (the cache writer truncates to the task's length); Retrieval examples carry a pair of
arrays.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from lra_data.errors import DataFormatError
from lra_data.tokenizers import rgb_to_gray, tokenize_bytes, tokenize_listops, tokenize_pixels
from spectraformer_core import RefusedGlobalError, load_pickle

Tokens = np.ndarray
Example = tuple[Tokens, int] | tuple[tuple[Tokens, Tokens], int]
"""One example: ``(tokens, label)``, or ``((tokens_0, tokens_1), label)`` for Retrieval."""

LISTOPS_HEADER = b"Source\tTarget"
"""The first line of every ListOps TSV of the release."""

PATHFINDER_DIFFICULTIES = {
    "easy": "curv_baseline",
    "intermediate": "curv_contour_length_9",
    "hard": "curv_contour_length_14",
}
"""Pathfinder difficulty -> folder of the release (``hard`` is the LRA's Pathfinder task)."""


def _require_file(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    return path


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """``(line number, line without its end-of-line)`` of a text file; blank lines only at the very end."""
    blank = None
    with _require_file(path).open("rb") as f:
        for number, raw in enumerate(f, start=1):
            line = raw.rstrip(b"\r\n")
            if not line.strip():
                blank = blank or number
                continue
            if blank is not None:
                raise DataFormatError(
                    path, "blank line inside the file; expected one record a line", line=blank
                )
            yield number, line


def _unpickle(path: Path, what: str, *, encoding: str = "ASCII") -> object:
    """The object pickled in ``path``; a global other than numpy's array, dtype and scalar ones is refused.

    [`load_pickle`][spectraformer_core.load_pickle] reads the file, so nothing from it runs.
    """
    with _require_file(path).open("rb") as f:
        try:
            return load_pickle(f, encoding=encoding)
        except RefusedGlobalError as error:
            raise DataFormatError(path, str(error)) from None
        except Exception as error:
            raise DataFormatError(path, f"not a {what} ({error})") from None


def _int_label(text: bytes, path: Path, line: int, num_classes: int) -> int:
    """A class label written as an integer (``3``) or an integral float (``3.0``), in ``[0, num_classes)``."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value.is_integer() or not 0 <= value < num_classes:
        raise DataFormatError(
            path,
            f"label {text.decode(errors='replace')!r}: expected an integer in [0, {num_classes})",
            line=line,
        )
    return int(value)


def _decode(field: bytes, encoding: str, what: str, path: Path, line: int) -> str:
    """``field`` as text, or a [`DataFormatError`][lra_data.DataFormatError] naming the byte that is not."""
    try:
        return field.decode(encoding)
    except UnicodeDecodeError as error:
        raise DataFormatError(
            path,
            f"{what}: byte 0x{field[error.start]:02x} at position {error.start + 1} is not {encoding} text",
            line=line,
        ) from None


def read_listops_tsv(path: str | Path) -> Iterator[Example]:
    """Examples of a ListOps release TSV (``basic_{train,val,test}.tsv``).

    The file starts with the header ``Source<TAB>Target``; each line holds the parenthesized expression and
    its value ``0``-``9``. Tokens are [`tokenize_listops`][lra_data.tokenize_listops] ids.
    """
    path = Path(path)
    lines = _lines(path)
    first = next(lines, None)
    if first is None or first[1] != LISTOPS_HEADER:
        got = "an empty file" if first is None else repr(first[1].decode(errors="replace")[:60])
        raise DataFormatError(path, f"expected the header 'Source\\tTarget', got {got}", line=1)
    for number, line in lines:
        fields = line.split(b"\t")
        if len(fields) != 2:
            raise DataFormatError(
                path, f"expected 2 tab-separated fields (Source, Target), got {len(fields)}", line=number
            )
        source = _decode(fields[0], "ascii", "Source", path, number)
        try:
            tokens = tokenize_listops(source)
        except ValueError as error:
            # tokenize_listops names its argument ("source: ..."); here the column is named instead.
            message = str(error).removeprefix("source: ")
            raise DataFormatError(path, f"Source: {message}", line=number) from None
        if tokens.size == 0:
            raise DataFormatError(path, "Source: expected an expression, got no symbols", line=number)
        yield tokens, _int_label(fields[1], path, number, 10)


def read_retrieval_tsv(path: str | Path) -> Iterator[Example]:
    """Examples of an AAN retrieval TSV (``new_aan_pairs.{train,eval,test}.tsv``).

    No header, no quoting: ``label<TAB>id1<TAB>id2<TAB>text1<TAB>text2``, label 0 or 1 (``1.0`` is read
    as 1). The two texts become byte-level tokens exactly as they stand in the file.
    """
    path = Path(path)
    for number, line in _lines(path):
        fields = line.split(b"\t")
        if len(fields) != 5:
            raise DataFormatError(
                path,
                f"expected 5 tab-separated fields (label, id1, id2, text1, text2), got {len(fields)}",
                line=number,
            )
        label = _int_label(fields[0], path, number, 2)
        yield (tokenize_bytes(fields[3]), tokenize_bytes(fields[4])), label


def _name_key(path: Path) -> tuple[tuple[int, int, str], ...]:
    """Sort key putting ``12_7.txt`` before ``100_3.txt`` (numbers compare as numbers)."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", path.name)
    )


def _listed_files(directory: Path, pattern: str, what: str, expected: str) -> list[Path]:
    """The ``pattern`` files of ``directory`` in numeric name order (``_name_key``).

    Raises:
        FileNotFoundError: ``directory`` is no folder (the message says ``expected``).
        DataFormatError: no file matches (``no {pattern} {what} in this folder``).
    """
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such folder (expected {expected})")
    files = sorted(directory.glob(pattern), key=_name_key)
    if not files:
        raise DataFormatError(directory, f"no {pattern} {what} in this folder")
    return files


def read_imdb(folder: str | Path, split: str) -> Iterator[Example]:
    """Examples of the IMDb reviews (``aclImdb/{train,test}/{neg,pos}/*.txt``): label 0 = neg, 1 = pos.

    Each review's bytes become byte-level tokens; negatives come first, files in numeric name order.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split: expected 'train' or 'test' for IMDb, got {split!r}")
    folder = Path(folder)
    for label, polarity in enumerate(("neg", "pos")):
        directory = folder / split / polarity
        expected = f"aclImdb/{split}/{polarity}/*.txt"
        for file in _listed_files(directory, "*.txt", "review", expected):
            yield tokenize_bytes(file.read_bytes()), label


CIFAR_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST_BATCH = "test_batch"


def _cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Gray images ``(n, 32, 32)`` and labels ``(n,)`` of one pickled CIFAR-10 batch."""
    batch = _unpickle(path, "pickled CIFAR-10 batch", encoding="bytes")
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise DataFormatError(path, f"expected a dict with keys b'data' and b'labels', got {keys}")
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[b"labels"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataFormatError(
            path, f"data: expected uint8 rows of 3 x 32 x 32 = 3072 values, got {data.dtype} {data.shape}"
        )
    if labels.shape != (data.shape[0],):
        raise DataFormatError(path, f"labels: expected {data.shape[0]} labels, got shape {labels.shape}")
    bad = np.flatnonzero((labels < 0) | (labels > 9))
    if bad.size:
        raise DataFormatError(path, f"labels[{bad[0]}] = {labels[bad[0]]}: expected an integer in [0, 10)")
    rgb = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return rgb_to_gray(rgb), labels.astype(np.int64)


def read_cifar10(folder: str | Path, split: str) -> Iterator[Example]:
    """Examples of CIFAR-10's python batches (``cifar-10-batches-py``), as gray pixel tokens.

    ``train`` is the first 90% of ``data_batch_1`` .. ``data_batch_5`` in order (45,000 images) and ``val``
    the last 10% (5,000), as the LRA splits ``train[:90%]`` / ``train[90%:]``; ``test`` is ``test_batch``.
    The batches are unpickled by [`load_pickle`][spectraformer_core.load_pickle], which refuses any global
    but numpy's array, dtype and scalar ones: a crafted batch raises a
    [`DataFormatError`][lra_data.DataFormatError] and runs no code.
    """
    folder = Path(folder)
    if split == "test":
        images, labels = _cifar_batch(folder / CIFAR_TEST_BATCH)
    elif split in ("train", "val"):
        parts = [_cifar_batch(folder / name) for name in CIFAR_TRAIN_BATCHES]
        images = np.concatenate([p[0] for p in parts])
        labels = np.concatenate([p[1] for p in parts])
        cut = len(labels) * 9 // 10
        images, labels = (images[:cut], labels[:cut]) if split == "train" else (images[cut:], labels[cut:])
    else:
        raise ValueError(f"split: expected 'train', 'val' or 'test' for CIFAR-10, got {split!r}")
    for image, label in zip(images, labels, strict=True):
        yield tokenize_pixels(image), int(label)


def pathfinder_metadata(folder: str | Path) -> list[tuple[Path, int, Path, int]]:
    """Every image of a Pathfinder difficulty folder: ``(image path, label, metadata file, line)``.

    ``folder/metadata/*.npy`` are text files despite their extension: one image a line, space-separated,
    the image folder and file name in the first two fields and the label (0 or 1) in the fourth. Files are
    read in numeric order (``0.npy``, ``1.npy``, ..., ``10.npy``).
    """
    folder = Path(folder)
    metadata = folder / "metadata"
    expected = "a Pathfinder folder with metadata/*.npy"
    files = _listed_files(metadata, "*.npy", "metadata file", expected)
    entries = []
    for file in files:
        for number, line in _lines(file):
            fields = line.split()
            if len(fields) < 4:
                raise DataFormatError(
                    file,
                    f"expected >= 4 space-separated fields (folder, file, _, label), got {len(fields)}",
                    line=number,
                )
            image = folder / _decode(fields[0], "utf-8", "folder", file, number)
            image = image / _decode(fields[1], "utf-8", "file", file, number)
            entries.append((image, _int_label(fields[3], file, number, 2), file, number))
    return entries


def pathfinder_split_indices(count: int, split: str, seed: int = 0) -> torch.Tensor:
    """Indices of ``split`` among ``count`` images: a seeded permutation cut 80% / 10% / 10%."""
    bounds = {
        "train": (0, count * 8 // 10),
        "val": (count * 8 // 10, count * 9 // 10),
        "test": (count * 9 // 10, count),
    }
    if split not in bounds:
        raise ValueError(f"split: expected 'train', 'val' or 'test', got {split!r}")
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    lo, hi = bounds[split]
    return order[lo:hi]


def read_pathfinder_image(
    path: Path, size: int, *, metadata: Path | None = None, line: int | None = None
) -> np.ndarray:
    """One gray ``uint8`` ``(size, size)`` Pathfinder PNG; errors name the image and its metadata line."""
    where = f" (listed in {metadata}:{line})" if metadata is not None else ""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such image{where}")
    try:
        with Image.open(path) as image:
            image.load()
            if image.size != (size, size):
                raise DataFormatError(
                    path, f"expected a {size} x {size} image{where}, got {image.size[0]} x {image.size[1]}"
                )
            gray = image if image.mode == "L" else image.convert("L")
            return np.asarray(gray, dtype=np.uint8).copy()
    except (UnidentifiedImageError, OSError) as error:
        raise DataFormatError(path, f"not a readable image{where} ({error})") from None


def read_pathfinder(
    folder: str | Path, split: str, *, seed: int = 0, image_size: int = 32
) -> Iterator[Example]:
    """Examples of one Pathfinder difficulty folder (e.g. ``pathfinder32/curv_contour_length_14``).

    All images listed in the metadata are split 80/10/10 by a permutation seeded with ``seed``
    ([`pathfinder_split_indices`][lra_data.pathfinder_split_indices]); each image must be
    ``image_size x image_size``.
    """
    entries = pathfinder_metadata(folder)
    for index in pathfinder_split_indices(len(entries), split, seed).tolist():
        image, label, metadata, line = entries[index]
        pixels = read_pathfinder_image(image, image_size, metadata=metadata, line=line)
        yield tokenize_pixels(pixels), label


def read_pickle(path: str | Path, *, num_classes: int, pixels: bool, pair: bool = False) -> Iterator[Example]:
    """Examples of a pre-processed LRA pickle (``{task}.{train,dev,test}.pickle``).

    The file holds a list of dicts with ``input_ids_0``, an optional ``input_ids_1`` (Retrieval) and
    ``label`` (``pair=True``: ``input_ids_1`` required, else refused). For sequence tasks the ids are
    kept and the trailing zeros (padding) dropped. For pixel tasks
    (``pixels=True``) the ids are gray values 0..255 that the pickles' ``input_ids != 0`` mask would take
    for padding; they become ``value + 1``, so black pixels are real tokens.

    The file may name only numpy's array, dtype and scalar globals
    ([`load_pickle`][spectraformer_core.load_pickle]); any other is refused with a
    [`DataFormatError`][lra_data.DataFormatError], so a crafted pickle runs no code.
    """
    path = Path(path)
    items = _unpickle(path, "readable pickle")
    if not isinstance(items, list):
        raise DataFormatError(path, f"expected a list of dicts, got {type(items).__name__}")
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "input_ids_0" not in item or "label" not in item:
            got = sorted(item) if isinstance(item, dict) else type(item).__name__
            raise DataFormatError(
                path, f"item {i}: expected a dict with 'input_ids_0' and 'label', got {got}"
            )
        label = np.asarray(item["label"]).reshape(-1)
        numeric = label.size == 1 and np.issubdtype(label.dtype, np.number)
        if not numeric or not float(label[0]).is_integer() or not 0 <= label[0] < num_classes:
            raise DataFormatError(
                path, f"item {i}: label {item['label']!r}: expected an integer in [0, {num_classes})"
            )
        if ("input_ids_1" in item) != pair:
            expected = "with" if pair else "without"
            raise DataFormatError(
                path, f"item {i}: expected a dict {expected} 'input_ids_1', got {sorted(item)}"
            )
        docs: list[Tokens] = []
        for key in ("input_ids_0", "input_ids_1")[: 1 + pair]:
            ids = np.asarray(item[key]).reshape(-1).astype(np.int64)
            if pixels:
                if ids.size and (ids.min() < 0 or ids.max() > 255):
                    raise DataFormatError(
                        path,
                        f"item {i}: {key}: expected gray values in [0, 255], got {ids.min()}..{ids.max()}",
                    )
                ids = ids + 1
            else:
                if ids.size and ids.min() < 0:
                    raise DataFormatError(path, f"item {i}: {key}: expected ids >= 0, got {ids.min()}")
                nonzero = np.flatnonzero(ids)
                ids = ids[: nonzero[-1] + 1] if nonzero.size else ids[:0]
            docs.append(ids)
        if pair:
            yield (docs[0], docs[1]), int(label[0])
        else:
            yield docs[0], int(label[0])
