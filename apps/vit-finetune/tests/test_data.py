"""The readers (digits, CIFAR-100 pickles, ImageFolder, VTAB-1k lists) and the batch preparation."""

import os
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from vit_finetune import data


def test_digits_splits_are_disjoint_fixed_and_three_channel():
    splits = data.load("digits", None, image_size=16)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (1200, 300, 297)
    image, label = splits.train[0]
    assert image.shape == (3, 8, 8)
    assert image.dtype == torch.uint8
    assert 0 <= label < 10
    assert len(splits.split("trainval")) == 1500
    again = data.load("digits", None, image_size=16)
    assert torch.equal(splits.test.images, again.test.images)


def test_cifar100_pickles_are_read_with_fine_labels(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name, n in (("train", 5010), ("test", 7)):
        table = {
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"fine_labels": list(range(n)),
            b"coarse_labels": [0] * n,
        }
        with (folder / name).open("wb") as f:
            pickle.dump(table, f)
    splits = data.load("cifar100", tmp_path, image_size=224)
    assert (len(splits.train), len(splits.val), len(splits.test), splits.num_classes) == (10, 5000, 7, 100)
    image, label = splits.test[3]
    with (folder / "test").open("rb") as f:
        raw = pickle.load(f, encoding="bytes")[b"data"][3]
    assert label == 3
    assert torch.equal(image, torch.from_numpy(raw.reshape(3, 32, 32)))
    with pytest.raises(FileNotFoundError, match="no CIFAR-100 file 'train'"):
        data.load("cifar100", tmp_path / "nowhere", image_size=224)


class CraftedData:
    """Pickles as the call ``os.system(command)``, as a crafted data file would."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_a_crafted_cifar100_pickle_is_refused_and_its_payload_never_runs(tmp_path):
    marker = tmp_path / "marker"
    with (tmp_path / "train").open("wb") as f:
        pickle.dump({b"data": CraftedData(f"touch {marker}"), b"fine_labels": [0]}, f)
    with pytest.raises(ValueError, match=rf"train: refused global {os.system.__module__}\.system"):
        data.load("cifar100", tmp_path, image_size=224)
    assert not marker.exists()


def write_image(path, color, size=(12, 10)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)


def test_imagefolder_tree_gives_classes_by_folder_and_square_crops(tmp_path):
    for split, count in (("train", 60), ("val", 2)):
        for c, color in (("cat", (255, 0, 0)), ("dog", (0, 0, 255))):
            for i in range(count):
                write_image(tmp_path / split / c / f"{i}.png", color)
    splits = data.load("imagefolder", tmp_path, image_size=6)
    assert splits.num_classes == 2
    assert (len(splits.train), len(splits.val), len(splits.test)) == (118, 2, 4)
    image, label = splits.test[3]
    assert image.shape == (3, 6, 6)
    assert label == 1
    assert image[2].min() == 255
    assert image[0].max() == 0


def test_vtab_lists_give_800_200_and_test_splits(tmp_path):
    for split, count in (("train800", 8), ("val200", 2), ("test", 5)):
        lines = []
        for i in range(count):
            write_image(tmp_path / "images" / f"{split}_{i}.jpg", (10 * i, 0, 0), size=(20, 30))
            lines.append(f"images/{split}_{i}.jpg {i % 3}")
        (tmp_path / f"{split}.txt").write_text("\n".join(lines) + "\n")
    splits = data.load("vtab", tmp_path, image_size=4)
    assert (len(splits.train), len(splits.val), len(splits.test), splits.num_classes) == (8, 2, 5, 3)
    assert splits.train[0][0].shape == (3, 4, 4)
    (tmp_path / "val200.txt").write_text("broken-line\n")
    with pytest.raises(ValueError, match=r"val200.txt:1: expected 'relative/path label'"):
        data.load("vtab", tmp_path, image_size=4)


def test_prepare_scales_resizes_and_normalizes():
    images = torch.full((2, 3, 8, 8), 255, dtype=torch.uint8)
    x = data.prepare(images, image_size=16, mean=(0.5,) * 3, std=(0.25,) * 3)
    assert x.shape == (2, 3, 16, 16)
    torch.testing.assert_close(x, torch.full_like(x, 2.0))
    gen = torch.Generator().manual_seed(0)
    ramp = torch.arange(16, dtype=torch.uint8).repeat(1, 3, 16, 1)
    a = data.prepare(ramp, image_size=16, mean=(0,) * 3, std=(1,) * 3, augment=True, generator=gen)
    b = data.prepare(
        ramp,
        image_size=16,
        mean=(0,) * 3,
        std=(1,) * 3,
        augment=True,
        generator=torch.Generator().manual_seed(0),
    )
    assert torch.equal(a, b)
    assert a.shape == (1, 3, 16, 16)


def _cifar_train_with_labels_as_row_numbers(tmp_path, n):
    """A fake CIFAR-100 release whose label of training row ``i`` is ``i``; returns the raw rows."""
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    rows = np.random.default_rng(1).integers(0, 256, (n, 3072), dtype=np.uint8)
    for name, table in (("train", rows), ("test", rows[:3])):
        with (folder / name).open("wb") as f:
            pickle.dump({b"data": table, b"fine_labels": list(range(len(table)))}, f)
    return rows


def test_held_out_splits_are_the_underlying_rows_in_increasing_order(tmp_path):
    rows = _cifar_train_with_labels_as_row_numbers(tmp_path, 5012)
    splits = data.load("cifar100", tmp_path, image_size=32)
    train = [splits.train[i][1] for i in range(len(splits.train))]
    val = [splits.val[i][1] for i in range(len(splits.val))]
    assert train == sorted(train)
    assert val == sorted(val)
    assert sorted(train + val) == list(range(5012))
    for split, position in ((splits.train, 0), (splits.train, 11), (splits.val, 0), (splits.val, 4999)):
        image, row = split[position]
        assert torch.equal(image, torch.from_numpy(rows[row].reshape(3, 32, 32)))


def test_trainval_is_train_followed_by_val(tmp_path):
    _cifar_train_with_labels_as_row_numbers(tmp_path, 5012)
    splits = data.load("cifar100", tmp_path, image_size=32)
    both = splits.split("trainval")
    assert len(both) == len(splits.train) + len(splits.val) == 5012
    expected = [splits.train[i][1] for i in range(12)] + [splits.val[i][1] for i in range(5000)]
    assert [both[i][1] for i in range(len(both))] == expected
