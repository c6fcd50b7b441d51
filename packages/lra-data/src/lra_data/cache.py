"""The cache: token arrays, labels and a JSON manifest, written once and read with memory mapping.

A cache folder holds, for every split and document ``k`` (0, and 1 for Retrieval's second document):

- ``{split}.tokens_{k}.bin``: all examples' token ids back to back (``uint16``, or ``int32`` for larger
  vocabularies), little-endian, no padding;
- ``{split}.offsets_{k}.bin``: ``int64`` ``(count + 1,)``; example ``i`` is
  ``tokens[offsets[i]:offsets[i+1]]``;
- ``{split}.labels.bin``: ``int64`` ``(count,)``;
- ``manifest.json``: task, source, tokenization (vocabulary), maximum length, and per split the counts,
  label histogram, length statistics, and each file's dtype, element count and SHA-256.

The manifest is written last, so an interrupted run leaves no loadable cache. [`load`][lra_data.load] checks
the manifest against the files (sizes always, checksums unless ``verify=False``) and refuses any mismatch.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lra_data.errors import CacheError
from lra_data.tokenizers import PAD_ID

MANIFEST = "manifest.json"
"""File name of a cache's manifest."""

CACHE_FORMAT = "lra-data-cache"
CACHE_VERSION = 1

_DTYPES: dict[str, np.dtype[Any]] = {
    "uint16": np.dtype("<u2"),
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


class CacheWriter:
    """Writes one task's splits into a cache folder; `finish` writes the manifest.

    Args:
        folder: the cache folder (created if missing).
        task: task name recorded in the manifest.
        num_classes: labels must lie in ``[0, num_classes)``.
        max_length: longer token sequences are truncated to it (counted in the manifest).
        pair: examples carry two token sequences (Retrieval).
        tokenization: recorded in the manifest; its ``vocab_size`` (or None: the largest id + 1, found
            while writing) bounds the token ids.
        source: recorded in the manifest (where the data came from, options used).
        overwrite: replace a cache already in ``folder`` (else refuse).
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        task: str,
        num_classes: int,
        max_length: int,
        pair: bool,
        tokenization: dict[str, Any],
        source: dict[str, Any],
        overwrite: bool = False,
    ):
        self.folder = Path(folder)
        manifest = self.folder / MANIFEST
        if manifest.exists():
            if not overwrite:
                raise FileExistsError(
                    f"{manifest}: a cache is already there; pass overwrite=True (--overwrite)"
                )
            manifest.unlink()  # first, so a half-overwritten cache never loads
        self.folder.mkdir(parents=True, exist_ok=True)
        self.task, self.num_classes, self.max_length, self.pair = task, num_classes, max_length, pair
        self.tokenization = dict(tokenization)
        self.source = source
        self.vocab_size = tokenization.get("vocab_size")
        self.dtype = "uint16" if self.vocab_size is not None and self.vocab_size <= 1 << 16 else "int32"
        self.splits: dict[str, dict[str, Any]] = {}
        self.largest_id = 0

    def write_split(self, split: str, examples: Iterable[Any]) -> dict[str, Any]:
        """Write the examples ``(tokens, label)`` (pairs of token arrays if ``pair``) of one split.

        Returns:
            The split's entry of the manifest.

        Raises:
            ValueError: a label out of range, a token id out of the vocabulary or equal to the padding id,
                an example of the wrong kind, or no example at all.
        """
        docs = 2 if self.pair else 1
        dtype = _DTYPES[self.dtype]
        offsets = [[0] for _ in range(docs)]
        labels = []
        truncated = [0] * docs
        paths = [self.folder / f"{split}.tokens_{k}.bin" for k in range(docs)]
        digests = [hashlib.sha256() for _ in range(docs)]
        files = [p.open("wb") for p in paths]
        try:
            for index, (tokens, label) in enumerate(examples):
                parts = tokens if self.pair else (tokens,)
                if len(parts) != docs:
                    raise ValueError(f"{split}[{index}]: expected {docs} token sequence(s), got {len(parts)}")
                if not (isinstance(label, int | np.integer) and 0 <= label < self.num_classes):
                    raise ValueError(
                        f"{split}[{index}]: label {label!r}: expected an integer in [0, {self.num_classes})"
                    )
                labels.append(int(label))
                for k, part in enumerate(parts):
                    ids = np.asarray(part).reshape(-1)
                    if ids.size > self.max_length:
                        ids = ids[: self.max_length]
                        truncated[k] += 1
                    if ids.size:
                        low, high = int(ids.min()), int(ids.max())
                        limit = self.vocab_size if self.vocab_size is not None else np.iinfo(dtype).max + 1
                        if low <= PAD_ID or high >= limit:
                            raise ValueError(
                                f"{split}[{index}]: token ids {low}..{high}: expected ids in [1, {limit}) "
                                f"(0 is padding only)"
                            )
                        self.largest_id = max(self.largest_id, high)
                    data = ids.astype(dtype).tobytes()
                    files[k].write(data)
                    digests[k].update(data)
                    offsets[k].append(offsets[k][-1] + ids.size)
        except BaseException:
            for f in files:
                f.close()
            for p in paths:
                p.unlink(missing_ok=True)
            raise
        for f in files:
            f.close()
        if not labels:
            for p in paths:
                p.unlink()
            raise ValueError(f"{split}: expected at least one example, got none")
        entry_files = {}
        for k in range(docs):
            entry_files[f"tokens_{k}"] = {
                "name": paths[k].name,
                "dtype": self.dtype,
                "count": offsets[k][-1],
                "sha256": digests[k].hexdigest(),
            }
            entry_files[f"offsets_{k}"] = self._write_array(f"{split}.offsets_{k}.bin", offsets[k])
        entry_files["labels"] = self._write_array(f"{split}.labels.bin", labels)
        lengths = [np.diff(np.asarray(o)) for o in offsets]
        entry = {
            "count": len(labels),
            "labels": {str(c): n for c, n in sorted(Counter(labels).items())},
            "lengths": [
                {"min": int(d.min()), "max": int(d.max()), "mean": round(float(d.mean()), 2)} for d in lengths
            ],
            "truncated": truncated,
            "files": entry_files,
        }
        self.splits[split] = entry
        return entry

    def _write_array(self, name: str, values: list[int]) -> dict[str, Any]:
        data = np.asarray(values, dtype=_DTYPES["int64"]).tobytes()
        (self.folder / name).write_bytes(data)
        return {
            "name": name,
            "dtype": "int64",
            "count": len(values),
            "sha256": hashlib.sha256(data).hexdigest(),
        }

    def finish(self) -> dict[str, Any]:
        """Write ``manifest.json`` (atomically) and return it."""
        if not self.splits:
            raise ValueError(f"{self.folder}: no split was written")
        tokenization = dict(self.tokenization)
        if tokenization.get("vocab_size") is None:
            tokenization["vocab_size"] = self.largest_id + 1
        manifest = {
            "format": CACHE_FORMAT,
            "version": CACHE_VERSION,
            "task": self.task,
            "num_classes": self.num_classes,
            "max_length": self.max_length,
            "pair": self.pair,
            "tokenization": tokenization,
            "source": self.source,
            "splits": self.splits,
        }
        tmp = self.folder / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=2) + "\n")
        os.replace(tmp, self.folder / MANIFEST)
        return manifest


def cache_folder(root: str | Path, task: str) -> Path:
    """The folder of ``task``'s cache under ``root``: ``root/task`` or ``root`` itself if it holds it."""
    root = Path(root)
    for folder in (root / task, root):
        if (folder / MANIFEST).is_file():
            return folder
    raise FileNotFoundError(
        f"{root / task / MANIFEST}: no such file (nor {root / MANIFEST}); expected a cache written by "
        f"'lra-data prepare --task {task} --out {root}' or 'lra-data generate'"
    )


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """The manifest of a cache folder, checked for its format and version."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (not a cache folder)")
    try:
        manifest = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CacheError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(manifest, dict):
        raise CacheError(f"{path}: expected a JSON object, got {type(manifest).__name__}")
    if manifest.get("format") != CACHE_FORMAT:
        raise CacheError(f"{path}: expected format {CACHE_FORMAT!r}, got {manifest.get('format')!r}")
    if manifest.get("version") != CACHE_VERSION:
        raise CacheError(f"{path}: expected cache version {CACHE_VERSION}, got {manifest.get('version')!r}")
    for key in ("task", "num_classes", "max_length", "pair", "tokenization", "splits"):
        if key not in manifest:
            raise CacheError(f"{path}: missing key {key!r}")
    return manifest


def _open_array(folder: Path, spec: dict[str, Any], verify: bool, *, mmap: bool) -> np.ndarray:
    """Check one file of a split against its manifest entry and open it (memory-mapped if ``mmap``)."""
    try:
        path = folder / spec["name"]
        dtype = _DTYPES[spec["dtype"]]
        count = int(spec["count"])
    except (KeyError, TypeError, ValueError) as error:
        raise CacheError(f"{folder / MANIFEST}: malformed file entry {spec!r} ({error})") from None
    if not path.is_file():
        raise CacheError(f"{path}: listed in the manifest but missing")
    size = path.stat().st_size
    if size != count * dtype.itemsize:
        raise CacheError(
            f"{path}: {size} bytes, expected {count * dtype.itemsize} ({count} x {spec['dtype']}) "
            "per the manifest"
        )
    if verify and _sha256(path) != spec.get("sha256"):
        raise CacheError(f"{path}: SHA-256 does not match the manifest (corrupted or modified file)")
    if count == 0:
        return np.zeros(0, dtype=dtype)
    if mmap:
        return np.memmap(path, dtype=dtype, mode="r", shape=(count,))
    return np.fromfile(path, dtype=dtype, count=count)


class LRADataset(torch.utils.data.Dataset[Any]):
    """One split of a task's cache, read with memory mapping.

    Item ``i`` is ``(tokens, label)``: ``tokens`` an ``int64`` tensor ``(length,)`` without padding,
    ``label`` an int; for Retrieval ``((tokens_0, tokens_1), label)``. Batch it with
    [`lra_data.collate`][lra_data.collate].

    Attributes:
        task: the task name.
        split: the split name.
        folder: the cache folder.
        manifest: the cache's manifest (dict).
        num_classes: number of classes.
        vocab_size: number of token ids, padding (0) included.
        max_length: the longest sequence the cache may hold (per document).
        pair: True for Retrieval (two documents per example).
        labels: ``int64`` tensor ``(n,)`` of every example's label (read into memory).
    """

    def __init__(self, folder: str | Path, split: str, *, task: str | None = None, verify: bool = True):
        self.folder = Path(folder)
        self.manifest = read_manifest(self.folder)
        where = self.folder / MANIFEST
        if task is not None and self.manifest["task"] != task:
            raise CacheError(f"{where}: holds task {self.manifest['task']!r}, expected {task!r}")
        if split not in self.manifest["splits"]:
            raise ValueError(
                f"split: {split!r} is not in the cache {self.folder}; "
                f"it has {', '.join(self.manifest['splits'])}"
            )
        self.task, self.split = self.manifest["task"], split
        self.num_classes = int(self.manifest["num_classes"])
        self.vocab_size = int(self.manifest["tokenization"]["vocab_size"])
        self.max_length = int(self.manifest["max_length"])
        self.pair = bool(self.manifest["pair"])
        self._verify = verify
        entry = self.manifest["splits"][split]
        docs = 2 if self.pair else 1
        try:
            files = entry["files"]
            self._specs = [files[f"tokens_{k}"] for k in range(docs)]
            offset_specs = [files[f"offsets_{k}"] for k in range(docs)]
            label_spec = files["labels"]
            count = int(entry["count"])
        except (KeyError, TypeError, ValueError) as error:
            raise CacheError(f"{where}: split {split!r} lacks {error}") from None
        self.labels = torch.from_numpy(
            _open_array(self.folder, label_spec, verify, mmap=False).astype(np.int64)
        )
        if self.labels.numel() != count:
            raise CacheError(f"{where}: split {split!r} has {self.labels.numel()} labels, expected {count}")
        if count and (self.labels.min() < 0 or self.labels.max() >= self.num_classes):
            raise CacheError(f"{self.folder / label_spec['name']}: labels outside [0, {self.num_classes})")
        self._offsets = []
        for spec, offset_spec in zip(self._specs, offset_specs, strict=True):
            offsets = _open_array(self.folder, offset_spec, verify, mmap=False)
            ok = offsets.size == count + 1 and offsets[0] == 0 and offsets[-1] == int(spec["count"])
            if not ok or (np.diff(offsets) < 0).any():
                raise CacheError(
                    f"{self.folder / offset_spec['name']}: expected {count + 1} non-decreasing offsets "
                    f"from 0 "
                    f"to {spec['count']}"
                )
            self._offsets.append(offsets)
        self._tokens = self._open_tokens(verify)

    def _open_tokens(self, verify: bool) -> list[np.ndarray]:
        return [_open_array(self.folder, spec, verify, mmap=True) for spec in self._specs]

    def __getstate__(self) -> dict[str, Any]:
        # Memory maps would be pickled as full copies (DataLoader workers under spawn): reopen them instead.
        state = self.__dict__.copy()
        state["_tokens"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._tokens = self._open_tokens(verify=False)

    def __len__(self) -> int:
        return self.labels.numel()

    def _doc(self, k: int, i: int) -> torch.Tensor:
        a, b = self._offsets[k][i], self._offsets[k][i + 1]
        tokens = np.asarray(self._tokens[k][a:b], dtype=np.int64)
        # A verified cache holds exactly what the writer checked; an unverified one may be damaged, and a
        # token id outside the vocabulary would only fail later, deep inside an embedding lookup.
        if not self._verify and tokens.size and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            raise CacheError(
                f"{self.folder / self._specs[k]['name']}: example {i} holds token ids "
                f"{tokens.min()}..{tokens.max()}, outside the vocabulary [0, {self.vocab_size}); the cache "
                "is damaged (load it with verify=True to check its checksums, or rebuild it)"
            )
        return torch.from_numpy(tokens)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"index: {index} out of range for {self.task}/{self.split} with {n} examples")
        i = index % n
        label = int(self.labels[i])
        if self.pair:
            return (self._doc(0, i), self._doc(1, i)), label
        return self._doc(0, i), label

    @property
    def lengths(self) -> torch.Tensor:
        """Token counts of the examples: ``(n,)``, or ``(n, 2)`` for Retrieval."""
        lengths = torch.stack([torch.from_numpy(np.diff(o)) for o in self._offsets], dim=-1)
        return lengths if self.pair else lengths[:, 0]

    def __repr__(self) -> str:
        return f"LRADataset(task={self.task!r}, split={self.split!r}, n={len(self)}, folder='{self.folder}')"
