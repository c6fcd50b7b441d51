"""Caches: built by `prepare` (real files) or `generate` (offline), read by `load`."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lra_data.cache import CacheWriter, LRADataset, cache_folder
from lra_data.listops import ListOpsConfig, iter_listops
from lra_data.pathfinder import PathfinderConfig, iter_pathfinder
from lra_data.readers import Example, read_pickle
from lra_data.tasks import ReleaseOptions, task_spec
from lra_data.tokenizers import tokenize_listops, tokenize_pixels
from spectraformer_core import check_int

PICKLE_SPLITS = {"train": "train", "val": "dev", "test": "test"}
"""Our split name -> the split name of the pre-processed pickles' file names."""


def load(task: str, split: str, root: str | Path, *, verify: bool = True) -> LRADataset:
    """One split of a task's cache, as a map-style dataset of ``(tokens, label)``.

    Args:
        task: one of [`TASKS`][lra_data.TASKS].
        split: ``train``, ``val`` or ``test`` (Text has ``train`` and ``test`` only).
        root: the ``--out`` folder of ``lra-data prepare``/``generate`` (the cache is ``root/task``), or
            the task's cache folder itself.
        verify: check every file's SHA-256 against the manifest (sizes, offsets and labels are always
            checked). Without it, each example's token ids are checked against the vocabulary as it is
            read.

    Raises:
        ValueError: an unknown task or split.
        FileNotFoundError: no cache for the task under ``root``.
        lra_data.CacheError: the cache does not match its manifest.
    """
    task_spec(task)
    return LRADataset(cache_folder(root, task), split, task=task, verify=verify)


@dataclass(frozen=True)
class PrepareConfig:
    """What ``lra-data prepare`` does; its flags map onto these fields.

    Attributes:
        task: one of [`TASKS`][lra_data.TASKS].
        source: the downloaded data: the release folder (or a folder above it), ``aclImdb``,
            ``cifar-10-batches-py``, or a folder of pre-processed ``{task}.{split}.pickle`` files.
        out: the cache root; the cache goes to ``out/task``.
        format: ``release`` (the data sets' own files), ``pickle`` (pre-processed pickles) or ``auto``
            (pickles if ``{prefix}.train.pickle`` is in ``source``).
        pickle_prefix: the ``{task}`` part of the pickles' names (default: the task's name, and
            ``pathfinder32-curv_contour_length_14`` style for Pathfinder).
        difficulty: see [`ReleaseOptions`][lra_data.ReleaseOptions].
        split_seed: see [`ReleaseOptions`][lra_data.ReleaseOptions].
        image_size: see [`ReleaseOptions`][lra_data.ReleaseOptions].
        overwrite: replace an existing cache.
    """

    task: str
    source: Path
    out: Path
    format: str = "auto"
    pickle_prefix: str | None = None
    difficulty: str = "hard"
    split_seed: int = 0
    image_size: int = 32
    overwrite: bool = False


def _pickle_files(config: PrepareConfig, prefix: str) -> dict[str, Path]:
    source = Path(config.source)
    return {
        split: source / f"{prefix}.{name}.pickle"
        for split, name in PICKLE_SPLITS.items()
        if (source / f"{prefix}.{name}.pickle").is_file()
    }


def prepare(config: PrepareConfig) -> dict[str, Any]:
    """Convert a task's downloaded files into a cache once; returns the manifest.

    Raises:
        ValueError: an unknown task or format, or malformed data
            ([`DataFormatError`][lra_data.DataFormatError]).
        FileNotFoundError: the source or one of its files is missing.
        FileExistsError: a cache exists at ``out/task`` and ``overwrite`` is off.
    """
    spec = task_spec(config.task)
    if config.format not in ("auto", "release", "pickle"):
        raise ValueError(f"format: expected 'auto', 'release' or 'pickle', got {config.format!r}")
    options = ReleaseOptions(config.difficulty, config.split_seed, config.image_size)
    max_length = config.image_size**2 if spec.name == "pathfinder" else spec.max_length
    prefix = config.pickle_prefix or spec.pickle_prefix(options)
    pickles = _pickle_files(config, prefix) if Path(config.source).is_dir() else {}
    use_pickles = config.format == "pickle" or (config.format == "auto" and "train" in pickles)
    if use_pickles:
        if "train" not in pickles:
            raise FileNotFoundError(f"{Path(config.source) / f'{prefix}.train.pickle'}: no such file")
        tokenization = dict(spec.tokenization)
        if not spec.pixels:
            tokenization = {
                "scheme": "pickle",
                "vocab_size": None,
                "pad_id": 0,
                "vocab": None,
                "description": "token ids as in the pre-processed pickles (trailing padding dropped)",
            }
        source: dict[str, Any] = {
            "kind": "pickle",
            "path": str(Path(config.source).resolve()),
            "prefix": prefix,
            "files": {split: path.name for split, path in pickles.items()},
        }
        splits = {
            split: read_pickle(path, num_classes=spec.num_classes, pixels=spec.pixels, pair=spec.pair)
            for split, path in pickles.items()
        }
    else:
        folder = spec.locate(config.source, options)
        tokenization = dict(spec.tokenization)
        source = {"kind": "release", "path": str(folder.resolve())}
        if spec.name == "pathfinder":
            source.update(
                difficulty=options.difficulty_folder,
                split_seed=options.split_seed,
                image_size=options.image_size,
            )
        splits = {split: spec.read(folder, split, options) for split in spec.splits}
    writer = CacheWriter(
        Path(config.out) / spec.name,
        task=spec.name,
        num_classes=spec.num_classes,
        max_length=max_length,
        pair=spec.pair,
        tokenization=tokenization,
        source=source,
        overwrite=config.overwrite,
    )
    for split, examples in splits.items():
        writer.write_split(split, examples)
    return writer.finish()


def split_seed(seed: int, *labels: str) -> int:
    """A 63-bit seed derived from ``seed`` and labels, so splits and tasks draw independent streams."""
    text = "/".join(["lra-data", str(seed), *labels])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


@dataclass(frozen=True)
class GenerateConfig:
    """What ``lra-data generate`` does; its flags map onto these fields.

    Attributes:
        task: ``listops`` or ``pathfinder``.
        n: training examples.
        out: the cache root; the cache goes to ``out/task``.
        val: validation examples (default ``max(1, n // 10)``).
        test: test examples (default ``max(1, n // 10)``).
        seed: every split draws from its own stream derived from this seed
            ([`split_seed`][lra_data.split_seed]).
        listops: the ListOps generator's rules.
        pathfinder: the Pathfinder generator's geometry.
        overwrite: replace an existing cache.
    """

    task: str
    n: int
    out: Path
    val: int | None = None
    test: int | None = None
    seed: int = 0
    listops: ListOpsConfig = field(default_factory=ListOpsConfig)
    pathfinder: PathfinderConfig = field(default_factory=PathfinderConfig)
    overwrite: bool = False


def _listops_examples(n: int, seed: int, config: ListOpsConfig) -> Iterator[Example]:
    for source, label in iter_listops(n, seed=seed, config=config):
        yield tokenize_listops(source), label


def _pathfinder_examples(n: int, seed: int, config: PathfinderConfig) -> Iterator[Example]:
    for sample in iter_pathfinder(n, seed=seed, config=config):
        yield tokenize_pixels(sample.image.numpy()), sample.label


@dataclass(frozen=True)
class _Generator:
    settings: Callable[[GenerateConfig], Any]  # the generator's config within a GenerateConfig
    examples: Callable[[int, int, Any], Iterator[Example]]  # (count, seed, settings) -> examples
    max_length: Callable[[Any], int]  # the longest sequence the settings can make


GENERATORS: dict[str, _Generator] = {
    "listops": _Generator(lambda c: c.listops, _listops_examples, lambda s: s.max_length),
    "pathfinder": _Generator(lambda c: c.pathfinder, _pathfinder_examples, lambda s: s.size**2),
}
"""Tasks that [`generate`][lra_data.generate] can make offline."""


def generate(config: GenerateConfig) -> dict[str, Any]:
    """Write a generated ListOps or Pathfinder data set in the cache format of [`prepare`][lra_data.prepare].

    Split ``s`` is drawn with the seed ``split_seed(config.seed, config.task, s)``, so the training split of
    ``generate`` equals ``generate_listops(n, seed=split_seed(seed, "listops", "train"), ...)``.

    Returns:
        The manifest.
    """
    if config.task not in GENERATORS:
        raise ValueError(f"task: no generator for {config.task!r}; expected one of {', '.join(GENERATORS)}")
    counts = {"train": config.n}
    for split in ("val", "test"):
        counts[split] = (
            getattr(config, split) if getattr(config, split) is not None else max(1, config.n // 10)
        )
    for split, count in counts.items():
        check_int("n" if split == "train" else split, count, 1)
    spec = task_spec(config.task)
    generator = GENERATORS[config.task]
    settings = generator.settings(config)
    writer = CacheWriter(
        Path(config.out) / spec.name,
        task=spec.name,
        num_classes=spec.num_classes,
        max_length=generator.max_length(settings),
        pair=False,
        tokenization=spec.tokenization,
        source={"kind": "generated", "seed": config.seed, "config": dataclasses.asdict(settings)},
        overwrite=config.overwrite,
    )
    for split, count in counts.items():
        writer.write_split(
            split, generator.examples(count, split_seed(config.seed, config.task, split), settings)
        )
    return writer.finish()
