"""The pickled formats (CIFAR-10 batches, pre-processed LRA pickles) are read without running their code."""

import io
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from lra_data import DataFormatError, read_cifar10, read_pickle, rgb_to_gray


def crafted_cifar(folder: Path, payload: object) -> Path:
    """A ``test_batch`` of CIFAR-10's structure whose ``b'data'`` is ``payload``."""
    with (folder / "test_batch").open("wb") as f:
        pickle.dump({b"batch_label": b"testing batch 1 of 1", b"labels": [0], b"data": payload}, f)
    return folder / "test_batch"


def crafted_lra(folder: Path, payload: object) -> Path:
    """An ``image.test.pickle`` of the pre-processed format whose first ``input_ids_0`` is ``payload``."""
    with (folder / "image.test.pickle").open("wb") as f:
        pickle.dump([{"input_ids_0": payload, "label": np.int64(0)}], f)
    return folder / "image.test.pickle"


def read_crafted(fmt: str, folder: Path, payload: object) -> Path:
    """Write the crafted file of format ``fmt`` and read it with its reader; returns the file's path."""
    if fmt == "cifar":
        path = crafted_cifar(folder, payload)
        list(read_cifar10(folder, "test"))
    else:
        path = crafted_lra(folder, payload)
        list(read_pickle(path, num_classes=10, pixels=True))
    return path


FORMATS = ["cifar", "lra"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_crafted_pickle_is_refused_naming_the_file_and_the_global(tmp_path, lra_files, fmt):
    path = tmp_path / ("test_batch" if fmt == "cifar" else "image.test.pickle")
    with pytest.raises(DataFormatError) as error:
        read_crafted(fmt, tmp_path, lra_files.SystemCall("true"))
    assert str(error.value).startswith(f"{path}: refused global {os.system.__module__}.system: ")


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_crafted_pickle_never_runs_its_payload(tmp_path, lra_files, fmt):
    marker = tmp_path / "marker"
    with pytest.raises(DataFormatError):
        read_crafted(fmt, tmp_path, lra_files.SystemCall(f"touch {marker}"))
    assert not marker.exists()


def cifar_arrays() -> tuple[np.ndarray, list[int]]:
    rng = np.random.default_rng(7)
    return rng.integers(0, 256, size=(3, 3072), dtype=np.uint8), [4, 0, 9]


def expected_cifar_tokens(data: np.ndarray) -> list[list[int]]:
    rgb = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return (rgb_to_gray(rgb).reshape(len(data), -1).astype(np.int64) + 1).tolist()


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_cifar_batches_of_every_pickle_protocol_still_read(tmp_path, protocol):
    data, labels = cifar_arrays()
    with (tmp_path / "test_batch").open("wb") as f:
        pickle.dump({b"batch_label": b"testing batch 1 of 1", b"labels": labels, b"data": data}, f, protocol)
    examples = list(read_cifar10(tmp_path, "test"))
    assert [t.tolist() for t, _ in examples] == expected_cifar_tokens(data)
    assert [label for _, label in examples] == labels


def lra_items() -> list[dict]:
    """Items as Nystromformer's ``LRA/datasets/*.py`` write them: int32 arrays, numpy scalar labels."""
    return [
        {
            "input_ids_0": np.array([5, 3, 0, 0], np.int32),
            "input_ids_1": np.array([9, 0], np.int32),
            "label": np.int32(1),
        },
        {
            "input_ids_0": np.array([7, 0], np.int32),
            "input_ids_1": np.array([], np.int32),
            "label": np.int64(0),
        },
    ]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_lra_pickles_of_every_pickle_protocol_still_read(tmp_path, protocol):
    path = tmp_path / "retrieval.test.pickle"
    path.write_bytes(pickle.dumps(lra_items(), protocol))
    examples = list(read_pickle(path, num_classes=2, pixels=False, pair=True))
    assert [(d0.tolist(), d1.tolist(), label) for (d0, d1), label in examples] == [
        ([5, 3], [9], 1),
        ([7], [], 0),
    ]


def numpy_1_spelling(raw: bytes) -> bytes:
    """A protocol-2 pickle as numpy 1.x writes it: its internals under ``numpy.core``, not ``numpy._core``.

    Protocol 2 names globals as newline-terminated text (no length prefix), so the rename keeps it valid.
    """
    assert b"numpy._core." in raw
    return raw.replace(b"numpy._core.", b"numpy.core.")


def test_lra_pickles_written_by_numpy_1_still_read(tmp_path):
    path = tmp_path / "retrieval.test.pickle"
    path.write_bytes(numpy_1_spelling(pickle.dumps(lra_items(), 2)))
    examples = list(read_pickle(path, num_classes=2, pixels=False, pair=True))
    assert [(d0.tolist(), d1.tolist(), label) for (d0, d1), label in examples] == [
        ([5, 3], [9], 1),
        ([7], [], 0),
    ]


class Python2Pickler(pickle._Pickler):
    """Writes ``str`` and ``bytes`` as Python 2's byte strings (BINSTRING), as in CIFAR-10's batches."""

    dispatch = pickle._Pickler.dispatch.copy()

    def save_py2_str(self, obj):
        data = obj if isinstance(obj, bytes) else obj.encode("latin1")
        if len(data) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(data)) + data)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str
    dispatch[str] = save_py2_str


def python_2_batch(data: np.ndarray, labels: list[int]) -> bytes:
    """A CIFAR-10 batch as ``cPickle.dump(batch, f, 2)`` of Python 2 with numpy 1.x wrote it."""
    batch = {
        b"batch_label": b"testing batch 1 of 1",
        b"labels": labels,
        b"data": data,
        b"filenames": [b"a.png"] * 3,
    }
    buffer = io.BytesIO()
    Python2Pickler(buffer, protocol=2).dump(batch)
    return numpy_1_spelling(buffer.getvalue())


def test_cifar_batches_written_by_python_2_still_read(tmp_path):
    data, labels = cifar_arrays()
    (tmp_path / "test_batch").write_bytes(python_2_batch(data, labels))
    examples = list(read_cifar10(tmp_path, "test"))
    assert [t.tolist() for t, _ in examples] == expected_cifar_tokens(data)
    assert [label for _, label in examples] == labels


def test_a_file_that_is_no_pickle_is_named(tmp_path):
    path = tmp_path / "image.test.pickle"
    path.write_bytes(b"not a pickle")
    with pytest.raises(DataFormatError, match=r"image.test.pickle: not a readable pickle \("):
        list(read_pickle(path, num_classes=10, pixels=True))
