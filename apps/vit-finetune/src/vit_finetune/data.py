"""Image classification data: scikit-learn's digits (offline default), CIFAR-100, ImageFolder, VTAB-1k.

Every data set gives ``train``, ``val`` and ``test`` splits of ``(uint8 image (3, H, W), label)`` pairs;
`prepare` turns a batch into the model's input on the device (scale to [0, 1], resize, optional
flip/crop augmentation, normalize):

    splits = load("cifar100", "data/cifar-100-python", image_size=224)
    x = prepare(images.to(device), image_size=224, mean=(0.5,) * 3, std=(0.5,) * 3)

Layouts read:

- ``digits``: ``sklearn.datasets.load_digits`` (1797 8x8 images shipped with scikit-learn), gray copied to
  3 channels; a fixed split of 1200 / 300 / 297.
- ``cifar100``: the python pickle release (``train`` and ``test`` files holding ``data`` and
  ``fine_labels``; ``DIR`` may be ``cifar-100-python`` or its parent); ``val`` is a fixed 5000 of ``train``.
- ``imagefolder``: ``DIR/train/<class>/*.jpg`` and ``DIR/val/<class>/...`` (ImageNet-1k, Places365): ``test``
  is ``DIR/test`` if it exists, else ``DIR/val``; ``val`` is ``DIR/val`` when there is a ``DIR/test``, else a
  fixed 2% (at most 10,000) of ``train``. Images are resized (shorter side) and center-cropped.
- ``vtab``: one VTAB-1k task folder with ``train800.txt``, ``val200.txt`` and ``test.txt`` (lines
  ``relative/path label``, the layout of the usual VTAB-1k preparation); images are resized to a square.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import ConcatDataset, Dataset, Subset

from spectraformer_core import RefusedGlobalError, Registry, load_pickle

SPLITS = ("train", "val", "test")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".gif", ".tif", ".tiff", ".webp")


class TensorImages(Dataset):
    """Images held in memory: ``images (N, 3, H, W)`` uint8, ``labels (N,)`` int64."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], int(self.labels[index])


class ImageFiles(Dataset):
    """Images decoded from files on access (PIL), resized to ``image_size`` x ``image_size``.

    Args:
        items: ``(path, label)`` pairs.
        image_size: output side.
        crop: True: shorter side to ``image_size`` then a center crop; False: resize to the square.
    """

    def __init__(self, items: list[tuple[Path, int]], image_size: int, *, crop: bool) -> None:
        self.items, self.image_size, self.crop = items, image_size, crop

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        path, label = self.items[index]
        try:
            with Image.open(path) as image:
                image = image.convert("RGB")
        except OSError as error:
            raise ValueError(f"{path}: cannot read the image ({error})") from None
        size = self.image_size
        if self.crop:
            scale = size / min(image.size)
            w, h = max(size, round(image.size[0] * scale)), max(size, round(image.size[1] * scale))
            image = image.resize((w, h), Image.Resampling.BICUBIC)
            left, top = (w - size) // 2, (h - size) // 2
            image = image.crop((left, top, left + size, top + size))
        else:
            image = image.resize((size, size), Image.Resampling.BICUBIC)
        return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1), label


@dataclass(frozen=True)
class Splits:
    """The splits of a data set and its number of classes."""

    train: Dataset
    val: Dataset
    test: Dataset
    num_classes: int

    def split(self, name: str) -> Dataset:
        """``train``, ``val``, ``test``, or ``trainval`` (train followed by val)."""
        if name == "trainval":
            return ConcatDataset([self.train, self.val])
        if name not in SPLITS:
            raise ValueError(f"split: expected one of {', '.join(SPLITS)} or trainval, got {name!r}")
        return getattr(self, name)


def _holdout(n: int, count: int) -> tuple[list[int], list[int]]:
    """``(kept, held out)`` indices: a fixed random ``count`` of ``range(n)`` held out (seed 0 always)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    return order[count:].sort().values.tolist(), order[:count].sort().values.tolist()


# ----------------------------------------------------------------------------------------------- readers
def load_digits(root: Path | None, image_size: int) -> Splits:
    """scikit-learn's bundled 8x8 digits as 3-channel uint8 images (``root`` is not used)."""
    from sklearn.datasets import load_digits as sklearn_digits

    digits = sklearn_digits()
    images = torch.from_numpy(np.round(digits.images * (255 / 16)).astype(np.uint8)).unsqueeze(1)
    images = images.expand(-1, 3, -1, -1).contiguous()
    labels = torch.from_numpy(digits.target.astype(np.int64))
    rest, test = _holdout(len(labels), 297)
    train, val = rest[300:], rest[:300]
    pick = lambda idx: TensorImages(images[idx], labels[idx])  # noqa: E731
    return Splits(pick(train), pick(val), pick(test), 10)


def _cifar_file(root: Path, name: str) -> dict:
    for folder in (root, root / "cifar-100-python"):
        if (folder / name).is_file():
            with (folder / name).open("rb") as f:
                try:
                    return load_pickle(f, encoding="bytes")  # runs no code from the file
                except RefusedGlobalError as error:
                    raise ValueError(f"{folder / name}: {error}") from None
    raise FileNotFoundError(
        f"data_path: no CIFAR-100 file {name!r} in {root} or {root / 'cifar-100-python'} (expected the "
        "python "
        "release, cifar-100-python.tar.gz, unpacked)"
    )


def load_cifar100(root: Path | None, image_size: int) -> Splits:
    """CIFAR-100 from its python pickle release (fine labels); 5000 training images held out as ``val``."""
    if root is None:
        raise ValueError("data_path: cifar100 needs the folder of the unpacked python release (--data-path)")

    def read(name: str) -> TensorImages:
        table = _cifar_file(Path(root), name)
        try:
            data, labels = table[b"data"], table[b"fine_labels"]
        except KeyError as error:
            raise ValueError(f"{root}/{name}: not a CIFAR-100 pickle (missing {error})") from None
        images = torch.from_numpy(np.asarray(data, dtype=np.uint8).reshape(-1, 3, 32, 32))
        return TensorImages(images, torch.tensor(labels, dtype=torch.int64))

    full = read("train")
    kept, held = _holdout(len(full), 5000)
    return Splits(Subset(full, kept), Subset(full, held), read("test"), 100)


def _folder_items(folder: Path, classes: list[str]) -> list[tuple[Path, int]]:
    items = []
    for label, name in enumerate(classes):
        for path in sorted((folder / name).rglob("*")):
            if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file():
                items.append((path, label))
    return items


def load_imagefolder(root: Path | None, image_size: int) -> Splits:
    """An ImageFolder tree ``root/{train,val[,test]}/<class>/<image>`` (see the module docstring)."""
    if root is None:
        raise ValueError("data_path: imagefolder needs the root holding train/ and val/ (--data-path)")
    root = Path(root)
    if not (root / "train").is_dir():
        raise FileNotFoundError(f"data_path: expected class folders under {root / 'train'}")
    classes = sorted(p.name for p in (root / "train").iterdir() if p.is_dir())
    if not classes:
        raise ValueError(f"data_path: no class folders in {root / 'train'}")
    test_dir = root / "test" if (root / "test").is_dir() else root / "val"
    if not test_dir.is_dir():
        raise FileNotFoundError(f"data_path: expected {root / 'val'} (or {root / 'test'}) beside train/")
    make = lambda items: ImageFiles(items, image_size, crop=True)  # noqa: E731
    train = make(_folder_items(root / "train", classes))
    if len(train) == 0:
        raise ValueError(f"data_path: no images ({', '.join(IMAGE_SUFFIXES)}) under {root / 'train'}")
    test = make(_folder_items(test_dir, classes))
    if test_dir.name == "test" and (root / "val").is_dir():
        return Splits(train, make(_folder_items(root / "val", classes)), test, len(classes))
    kept, held = _holdout(len(train), min(10_000, max(1, len(train) // 50)))
    return Splits(Subset(train, kept), Subset(train, held), test, len(classes))


def _list_items(root: Path, name: str) -> list[tuple[Path, int]]:
    path = root / name
    if not path.is_file():
        raise FileNotFoundError(
            f"data_path: no VTAB-1k list {path} (expected train800.txt, val200.txt, test.txt)"
        )
    items = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            relative, label = line.rsplit(maxsplit=1)
            items.append((root / relative, int(label)))
        except ValueError:
            raise ValueError(f"{path}:{number}: expected 'relative/path label', got {line!r}") from None
    return items


def load_vtab(root: Path | None, image_size: int) -> Splits:
    """One VTAB-1k task: 800 training and 200 validation images, and the full test set."""
    if root is None:
        raise ValueError("data_path: vtab needs one task's folder with train800.txt, val200.txt, test.txt")
    root = Path(root)
    lists = {
        split: _list_items(root, f"{name}.txt")
        for split, name in zip(SPLITS, ("train800", "val200", "test"), strict=True)
    }
    num_classes = 1 + max(label for items in lists.values() for _, label in items)
    make = lambda items: ImageFiles(items, image_size, crop=False)  # noqa: E731
    return Splits(make(lists["train"]), make(lists["val"]), make(lists["test"]), num_classes)


@dataclass(frozen=True)
class DataSpec:
    """A data set: its reader and the training defaults used when a flag is not given.

    Attributes:
        load: ``(root or None, image_size) -> Splits``.
        batch_size: default batch size.
        lr: default peak learning rate of AdamW.
        epochs: default epochs.
        model: default model name.
    """

    load: Callable[[Path | None, int], Splits]
    batch_size: int
    lr: float
    epochs: int
    model: str


#: Data sets by name, with their training defaults (the paper's Table 4 was lost in extraction: ours).
DATASETS: Registry[DataSpec] = Registry("data set")
DATASETS.register("digits")(DataSpec(load_digits, 64, 3e-3, 15, "vit-digits"))
DATASETS.register("cifar100")(DataSpec(load_cifar100, 128, 1e-4, 10, "vit_base_patch16_224.augreg_in21k"))
DATASETS.register("imagefolder")(
    DataSpec(load_imagefolder, 128, 1e-4, 10, "vit_base_patch16_224.augreg_in21k")
)
DATASETS.register("vtab")(DataSpec(load_vtab, 64, 1e-4, 100, "vit_base_patch16_224.augreg_in21k"))


def load(name: str, root: str | Path | None, *, image_size: int) -> Splits:
    """The splits of data set ``name`` read from ``root`` (decoded image files resized to ``image_size``)."""
    return DATASETS.get(name).load(None if root is None else Path(root), image_size)


def collate(items: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images (B, 3, H, W) uint8, labels (B,))``."""
    images = torch.stack([image for image, _ in items])
    return images, torch.tensor([label for _, label in items], dtype=torch.int64)


def prepare(
    images: torch.Tensor,
    *,
    image_size: int,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    augment: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """uint8 images ``(B, C, H, W)`` -> float32 model input ``(B, C, S, S)``.

    Scales to [0, 1], resizes to ``image_size`` (bilinear with antialiasing) when needed, and with
    ``augment`` flips each image horizontally with probability 1/2 and takes a random crop of the image
    padded by ``S / 8`` (reflection), drawing from ``generator``; then subtracts ``mean``, divides by ``std``.
    """
    x = images.float() / 255
    if x.shape[-2:] != (image_size, image_size):
        x = F.interpolate(
            x, size=(image_size, image_size), mode="bilinear", antialias=True, align_corners=False
        )
    if augment:
        b = x.shape[0]
        flip = torch.rand(b, generator=generator) < 0.5
        x = torch.where(flip.to(x.device)[:, None, None, None], x.flip(-1), x)
        pad = max(1, image_size // 8)
        padded = F.pad(x, (pad, pad, pad, pad), mode="reflect")
        offsets = torch.randint(0, 2 * pad + 1, (b, 2), generator=generator).tolist()
        x = torch.stack(
            [padded[i, :, r : r + image_size, c : c + image_size] for i, (r, c) in enumerate(offsets)]
        )
    mean_t = torch.tensor(mean, device=x.device).view(1, -1, 1, 1)
    std_t = torch.tensor(std, device=x.device).view(1, -1, 1, 1)
    return (x - mean_t) / std_t
