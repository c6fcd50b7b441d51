"""The five LRA tasks: what each reads, how it tokenizes, its lengths, classes and splits."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lra_data.readers import (
    PATHFINDER_DIFFICULTIES,
    Example,
    read_cifar10,
    read_imdb,
    read_listops_tsv,
    read_pathfinder,
    read_retrieval_tsv,
)
from lra_data.tokenizers import BYTE_VOCAB_SIZE, LISTOPS_VOCAB, PAD_ID, PIXEL_VOCAB_SIZE

TASKS = ("listops", "text", "retrieval", "image", "pathfinder")
"""Names of the five LRA tasks, in the paper's order."""


@dataclass(frozen=True)
class ReleaseOptions:
    """Options of the release readers that some tasks use.

    Attributes:
        difficulty: Pathfinder difficulty, ``easy``/``intermediate``/``hard`` or the folder name
            (``curv_baseline``, ``curv_contour_length_9``, ``curv_contour_length_14``).
        split_seed: seed of Pathfinder's 80/10/10 split.
        image_size: Pathfinder image side (32 for the LRA's Pathfinder).
    """

    difficulty: str = "hard"
    split_seed: int = 0
    image_size: int = 32

    @property
    def difficulty_folder(self) -> str:
        """The release folder of the difficulty."""
        if self.difficulty in PATHFINDER_DIFFICULTIES.values():
            return self.difficulty
        if self.difficulty not in PATHFINDER_DIFFICULTIES:
            known = [*PATHFINDER_DIFFICULTIES, *PATHFINDER_DIFFICULTIES.values()]
            raise ValueError(f"difficulty: unknown {self.difficulty!r}; expected one of {', '.join(known)}")
        return PATHFINDER_DIFFICULTIES[self.difficulty]


@dataclass(frozen=True)
class Task:
    """Everything ``prepare`` and ``load`` need to know about one task.

    Attributes:
        name: the task's name (one of [`TASKS`][lra_data.TASKS]).
        num_classes: labels lie in ``[0, num_classes)``.
        max_length: tokens kept per document (longer ones are truncated).
        pair: two documents per example (Retrieval).
        pixels: tokens are gray pixels (the pickles store them unshifted).
        tokenization: manifest entry describing the token ids.
        splits: the split names of the release.
        marker: a file or folder that the data folder holds, to find it under the given source.
        subfolders: where below the given source the data folder may sit.
        read: ``read(data_folder, split, options)`` yields the split's examples.
        pickle_prefix: ``pickle_prefix(options)``: the ``{task}`` part of ``{task}.{split}.pickle``.
    """

    name: str
    num_classes: int
    max_length: int
    pair: bool
    pixels: bool
    tokenization: dict[str, Any]
    splits: tuple[str, ...]
    marker: str
    subfolders: tuple[str, ...]
    read: Callable[[Path, str, ReleaseOptions], Iterator[Example]] = field(repr=False)
    pickle_prefix: Callable[[ReleaseOptions], str] = field(repr=False)

    def locate(self, source: str | Path, options: ReleaseOptions) -> Path:
        """The data folder below ``source`` that holds `marker`.

        Raises:
            FileNotFoundError: naming every place looked at.
        """
        source = Path(source)
        if not source.exists():
            raise FileNotFoundError(f"{source}: no such file or folder (source of task {self.name!r})")
        subfolders = [
            s.format(
                difficulty=options.difficulty_folder if self.name == "pathfinder" else "",
                size=options.image_size,
            )
            for s in self.subfolders
        ]
        tried = []
        for sub in ("", *subfolders):
            folder = source / sub if sub else source
            if (folder / self.marker).exists():
                return folder
            tried.append(str(folder / self.marker))
        raise FileNotFoundError(f"source: no {self.name} data at {source}; looked for {', '.join(tried)}")


def _pathfinder_read(folder: Path, split: str, options: ReleaseOptions) -> Iterator[Example]:
    wanted = options.difficulty_folder
    if folder.name in PATHFINDER_DIFFICULTIES.values() and folder.name != wanted:
        raise ValueError(
            f"source: {folder} is the {folder.name!r} folder, but difficulty={options.difficulty!r} "
            f"asks for {wanted!r}"
        )
    return read_pathfinder(folder, split, seed=options.split_seed, image_size=options.image_size)


_BYTES = {
    "scheme": "bytes+1",
    "vocab_size": BYTE_VOCAB_SIZE,
    "pad_id": PAD_ID,
    "vocab": None,
    "description": "UTF-8 byte b -> token b + 1; 0 is padding",
}
_PIXELS = {
    "scheme": "pixels+1",
    "vocab_size": PIXEL_VOCAB_SIZE,
    "pad_id": PAD_ID,
    "vocab": None,
    "description": "gray value v in 0..255 -> token v + 1; 0 is padding, so black pixels are not",
}

TASK_SPECS: dict[str, Task] = {
    "listops": Task(
        name="listops",
        num_classes=10,
        max_length=2000,
        pair=False,
        pixels=False,
        tokenization={
            "scheme": "listops",
            "vocab_size": len(LISTOPS_VOCAB),
            "pad_id": PAD_ID,
            "vocab": list(LISTOPS_VOCAB),
            "description": "operators with their '[', digits and ']' are tokens; parentheses dropped",
        },
        splits=("train", "val", "test"),
        marker="basic_train.tsv",
        subfolders=("listops-1000", "lra_release/listops-1000"),
        read=lambda folder, split, options: read_listops_tsv(folder / f"basic_{split}.tsv"),
        pickle_prefix=lambda options: "listops",
    ),
    "text": Task(
        name="text",
        num_classes=2,
        max_length=4000,
        pair=False,
        pixels=False,
        tokenization=_BYTES,
        splits=("train", "test"),
        marker="train/neg",
        subfolders=("aclImdb",),
        read=lambda folder, split, options: read_imdb(folder, split),
        pickle_prefix=lambda options: "text",
    ),
    "retrieval": Task(
        name="retrieval",
        num_classes=2,
        max_length=4000,
        pair=True,
        pixels=False,
        tokenization=_BYTES,
        splits=("train", "val", "test"),
        marker="new_aan_pairs.train.tsv",
        subfolders=("tsv_data", "lra_release/tsv_data"),
        read=lambda folder, split, options: read_retrieval_tsv(
            folder / f"new_aan_pairs.{'eval' if split == 'val' else split}.tsv"
        ),
        pickle_prefix=lambda options: "retrieval",
    ),
    "image": Task(
        name="image",
        num_classes=10,
        max_length=1024,
        pair=False,
        pixels=True,
        tokenization=_PIXELS,
        splits=("train", "val", "test"),
        marker="data_batch_1",
        subfolders=("cifar-10-batches-py",),
        read=lambda folder, split, options: read_cifar10(folder, split),
        pickle_prefix=lambda options: "image",
    ),
    "pathfinder": Task(
        name="pathfinder",
        num_classes=2,
        max_length=1024,
        pair=False,
        pixels=True,
        tokenization=_PIXELS,
        splits=("train", "val", "test"),
        marker="metadata",
        subfolders=(
            "{difficulty}",
            "pathfinder{size}/{difficulty}",
            "lra_release/pathfinder{size}/{difficulty}",
        ),
        read=_pathfinder_read,
        pickle_prefix=lambda options: f"pathfinder{options.image_size}-{options.difficulty_folder}",
    ),
}
"""Task name -> [`Task`][lra_data.Task]."""


def task_spec(name: str) -> Task:
    """The [`Task`][lra_data.Task] called ``name``.

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    if name not in TASK_SPECS:
        raise ValueError(f"task: unknown {name!r}; expected one of {', '.join(TASKS)}")
    return TASK_SPECS[name]
