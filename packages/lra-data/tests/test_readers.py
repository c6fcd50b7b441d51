import pickle

import numpy as np
import pytest
from PIL import Image

from lra_data import (
    DataFormatError,
    pathfinder_metadata,
    pathfinder_split_indices,
    read_cifar10,
    read_imdb,
    read_listops_tsv,
    read_pathfinder,
    read_pickle,
    read_retrieval_tsv,
    rgb_to_gray,
    tokenize_bytes,
    tokenize_listops,
)

# ListOps TSV


def test_listops_reader_returns_tokens_and_labels_of_every_line(listops_release, lra_files):
    examples = list(read_listops_tsv(listops_release / "basic_train.tsv"))
    assert [label for _, label in examples] == [label for _, label in lra_files.LISTOPS_LINES]
    assert examples[0][0].tolist() == tokenize_listops("[MAX 2 9 ]").tolist()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("( [MAX 2 ] )\t2\n", r"basic_test.tsv:1: expected the header 'Source\\tTarget'"),
        (
            "Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9\n( ( ( [MAX 2 ) 9\n",
            r"basic_test.tsv:3: expected 2 tab-separated fields .* got 1",
        ),
        (
            "Source\tTarget\n( [FIRST 2 ] )\t2\n",
            r"basic_test.tsv:2: Source: unknown ListOps symbol '\[FIRST'",
        ),
    ],
    ids=["missing-header", "truncated-line", "unknown-symbol"],
)
def test_listops_reader_refuses_a_malformed_file_naming_file_and_line(tmp_path, text, message):
    path = tmp_path / "basic_test.tsv"
    path.write_text(text)
    with pytest.raises(DataFormatError, match=message):
        list(read_listops_tsv(path))


@pytest.mark.parametrize("label", ["10", "-1", "x", "2.5"])
def test_listops_reader_refuses_labels_out_of_range(tmp_path, label):
    path = tmp_path / "basic_test.tsv"
    path.write_text(f"Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t{label}\n")
    with pytest.raises(
        DataFormatError, match=rf"basic_test.tsv:2: label '{label}': expected an integer in \[0, 10\)"
    ):
        list(read_listops_tsv(path))


def test_listops_reader_names_a_non_ascii_byte_and_its_position(tmp_path):
    path = tmp_path / "basic_test.tsv"
    path.write_bytes(b"Source\tTarget\n( [MAX 2 ] )\t2\n( [MAX \xff ] )\t2\n")
    with pytest.raises(DataFormatError) as error:
        list(read_listops_tsv(path))
    assert str(error.value) == f"{path}:3: Source: byte 0xff at position 8 is not ascii text"


def test_blank_lines_inside_a_file_are_refused_but_trailing_ones_allowed(tmp_path):
    path = tmp_path / "basic_train.tsv"
    path.write_text("Source\tTarget\n( [MAX 2 ] )\t2\n\n\n")
    assert len(list(read_listops_tsv(path))) == 1
    path.write_text("Source\tTarget\n\n( [MAX 2 ] )\t2\n")
    with pytest.raises(DataFormatError, match=r"basic_train.tsv:2: blank line"):
        list(read_listops_tsv(path))


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"basic_train.tsv: no such file"):
        list(read_listops_tsv(tmp_path / "basic_train.tsv"))


# Retrieval TSV


def test_retrieval_reader_keeps_both_texts_byte_exact_without_unquoting(retrieval_release, lra_files):
    examples = list(read_retrieval_tsv(retrieval_release / "new_aan_pairs.train.tsv"))
    assert [label for _, label in examples] == [1, 0, 1]
    for ((doc0, doc1), _), row in zip(examples, lra_files.RETRIEVAL_ROWS, strict=True):
        assert doc0.tolist() == tokenize_bytes(row[3]).tolist()
        assert doc1.tolist() == tokenize_bytes(row[4]).tolist()


def test_retrieval_reader_names_file_and_line_of_a_short_line(tmp_path):
    path = tmp_path / "new_aan_pairs.eval.tsv"
    path.write_bytes(b"1\ta\tb\ttext one\ttext two\n0\ta\tb\ttext one\n")
    with pytest.raises(DataFormatError, match=r"new_aan_pairs.eval.tsv:2: expected 5 tab-separated fields"):
        list(read_retrieval_tsv(path))


def test_retrieval_reader_refuses_labels_other_than_zero_and_one(tmp_path):
    path = tmp_path / "new_aan_pairs.test.tsv"
    path.write_bytes(b"2\ta\tb\tx\ty\n")
    with pytest.raises(DataFormatError, match=r":1: label '2': expected an integer in \[0, 2\)"):
        list(read_retrieval_tsv(path))


# IMDb


def test_imdb_reader_labels_neg_zero_pos_one_in_numeric_file_order(imdb, lra_files):
    examples = list(read_imdb(imdb, "train"))
    assert [label for _, label in examples] == [0, 0, 1]
    texts = [bytes((t - 1).astype(np.uint8)) for t, _ in examples]
    reviews = lra_files.IMDB_REVIEWS
    expected = [
        reviews["train", "neg"]["2_1.txt"],
        reviews["train", "neg"]["10_2.txt"],
        reviews["train", "pos"]["3_9.txt"],
    ]
    assert texts == [t.encode("utf-8") for t in expected]


def test_imdb_reader_names_a_missing_polarity_folder(imdb):
    for file in (imdb / "test" / "pos").iterdir():
        file.unlink()
    (imdb / "test" / "pos").rmdir()
    with pytest.raises(FileNotFoundError, match=r"aclImdb/test/pos: no such folder"):
        list(read_imdb(imdb, "test"))


def test_imdb_reader_refuses_an_empty_folder(imdb):
    for file in (imdb / "test" / "neg").iterdir():
        file.unlink()
    with pytest.raises(DataFormatError, match=r"test/neg: no \*.txt review"):
        list(read_imdb(imdb, "test"))


# CIFAR-10


def test_cifar_reader_splits_train_90_10_and_converts_to_gray(cifar, lra_files):
    train = list(read_cifar10(cifar, "train"))
    val = list(read_cifar10(cifar, "val"))
    test = list(read_cifar10(cifar, "test"))
    assert (len(train), len(val), len(test)) == (9, 1, 2)
    batch = lra_files.cifar_batch(2, seed=0)
    rgb = batch[b"data"].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    expected = rgb_to_gray(rgb).reshape(2, -1).astype(np.int64) + 1
    assert train[0][0].tolist() == expected[0].tolist()
    assert train[1][0].tolist() == expected[1].tolist()
    assert [label for _, label in train[:2]] == batch[b"labels"]
    assert train[0][0].min() == 1  # the all-black image: token 1, not padding
    last = lra_files.cifar_batch(2, seed=4)
    assert val[0][1] == last[b"labels"][1]


def test_cifar_reader_refuses_images_of_the_wrong_size(cifar):
    with (cifar / "test_batch").open("wb") as f:
        pickle.dump({b"data": np.zeros((2, 3 * 28 * 28), np.uint8), b"labels": [0, 1]}, f)
    with pytest.raises(
        DataFormatError, match=r"test_batch: data: expected uint8 rows of 3 x 32 x 32 = 3072 values"
    ):
        list(read_cifar10(cifar, "test"))


def test_cifar_reader_refuses_labels_out_of_range(cifar):
    with (cifar / "test_batch").open("wb") as f:
        pickle.dump({b"data": np.zeros((2, 3072), np.uint8), b"labels": [3, 10]}, f)
    with pytest.raises(
        DataFormatError, match=r"test_batch: labels\[1\] = 10: expected an integer in \[0, 10\)"
    ):
        list(read_cifar10(cifar, "test"))


def test_cifar_reader_names_a_missing_batch(cifar):
    (cifar / "data_batch_4").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_4: no such file"):
        list(read_cifar10(cifar, "train"))


# Pathfinder


def test_pathfinder_metadata_reads_folder_file_and_label_fields(pathfinder_release):
    entries = pathfinder_metadata(pathfinder_release)
    assert len(entries) == 20
    image, label, metadata, line = entries[0]
    assert image == pathfinder_release / "imgs/0/sample_0.png"
    assert (label, metadata.name, line) == (0, "0.npy", 1)
    assert sum(e[1] for e in entries) == sum(i % 3 % 2 for i in range(20))


def test_pathfinder_split_is_a_seeded_80_10_10_partition():
    parts = [pathfinder_split_indices(200, split, seed=5) for split in ("train", "val", "test")]
    assert [len(p) for p in parts] == [160, 20, 20]
    assert sorted(int(i) for p in parts for i in p) == list(range(200))
    assert pathfinder_split_indices(200, "val", seed=5).tolist() == parts[1].tolist()
    assert pathfinder_split_indices(200, "val", seed=6).tolist() != parts[1].tolist()


def test_pathfinder_reader_returns_the_png_pixels_plus_one(pathfinder_release):
    examples = list(read_pathfinder(pathfinder_release, "train", seed=0))
    assert len(examples) == 16
    entries = pathfinder_metadata(pathfinder_release)
    index = int(pathfinder_split_indices(20, "train", seed=0)[0])
    pixels = np.asarray(Image.open(entries[index][0]))
    assert examples[0][0].tolist() == (pixels.reshape(-1).astype(np.int64) + 1).tolist()
    assert examples[0][1] == entries[index][1]
    assert examples[0][0][0] == 1  # pixel (0, 0) is black in every test image


def _read_every_split(folder):
    return [list(read_pathfinder(folder, split)) for split in ("train", "val", "test")]


def test_pathfinder_reader_refuses_an_image_of_the_wrong_size_naming_its_metadata_line(pathfinder_release):
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(pathfinder_release / "imgs/1/sample_3.png")
    with pytest.raises(
        DataFormatError, match=r"sample_3.png: expected a 32 x 32 image \(listed in .*1.npy:2\), got 28 x 28"
    ):
        _read_every_split(pathfinder_release)


def test_pathfinder_reader_names_a_missing_image_and_its_metadata_line(pathfinder_release):
    (pathfinder_release / "imgs/0/sample_4.png").unlink()
    with pytest.raises(FileNotFoundError, match=r"sample_4.png: no such image \(listed in .*0.npy:3\)"):
        _read_every_split(pathfinder_release)


def test_pathfinder_reader_refuses_a_corrupted_image(pathfinder_release):
    (pathfinder_release / "imgs/0/sample_0.png").write_bytes(b"not a png")
    with pytest.raises(DataFormatError, match=r"sample_0.png: not a readable image"):
        _read_every_split(pathfinder_release)


def test_pathfinder_metadata_refuses_short_lines_and_bad_labels(pathfinder_release):
    (pathfinder_release / "metadata" / "2.npy").write_text("imgs/0 sample_0.png 0 1\nimgs/0 sample_0.png 0\n")
    with pytest.raises(DataFormatError, match=r"2.npy:2: expected >= 4 space-separated fields"):
        pathfinder_metadata(pathfinder_release)
    (pathfinder_release / "metadata" / "2.npy").write_text("imgs/0 sample_0.png 0 3\n")
    with pytest.raises(DataFormatError, match=r"2.npy:1: label '3': expected an integer in \[0, 2\)"):
        pathfinder_metadata(pathfinder_release)


# Pre-processed pickles


def test_pickle_reader_shifts_pixels_so_black_is_not_padding(tmp_path, lra_files):
    rows = [{"input_ids_0": np.array([0, 0, 255, 7], np.int32), "label": 1}]
    folder = lra_files.write_pickles(tmp_path, "image", {"train": rows})
    [(tokens, label)] = list(read_pickle(folder / "image.train.pickle", num_classes=10, pixels=True))
    assert tokens.tolist() == [1, 1, 256, 8]
    assert label == 1


def test_pickle_reader_drops_trailing_padding_of_sequences_and_reads_pairs(tmp_path, lra_files):
    rows = [{"input_ids_0": np.array([5, 3, 0, 0]), "input_ids_1": np.array([9, 0]), "label": np.int64(1)}]
    folder = lra_files.write_pickles(tmp_path, "retrieval", {"train": rows})
    [((doc0, doc1), label)] = list(
        read_pickle(folder / "retrieval.train.pickle", num_classes=2, pixels=False, pair=True)
    )
    assert (doc0.tolist(), doc1.tolist(), label) == ([5, 3], [9], 1)


def test_pickle_reader_refuses_items_without_the_expected_keys(tmp_path, lra_files):
    folder = lra_files.write_pickles(
        tmp_path, "text", {"train": [{"input_ids_0": np.array([3]), "label": 0}, {"ids": 1}]}
    )
    with pytest.raises(
        DataFormatError, match=r"text.train.pickle: item 1: expected a dict with 'input_ids_0' and 'label'"
    ):
        list(read_pickle(folder / "text.train.pickle", num_classes=2, pixels=False))


def test_pickle_reader_refuses_labels_out_of_range(tmp_path, lra_files):
    folder = lra_files.write_pickles(
        tmp_path, "listops", {"dev": [{"input_ids_0": np.array([3]), "label": 12}]}
    )
    with pytest.raises(
        DataFormatError, match=r"listops.dev.pickle: item 0: label 12: expected an integer in \[0, 10\)"
    ):
        list(read_pickle(folder / "listops.dev.pickle", num_classes=10, pixels=False))


def test_pickle_reader_refuses_non_numeric_labels(tmp_path, lra_files):
    folder = lra_files.write_pickles(
        tmp_path, "text", {"test": [{"input_ids_0": np.array([3]), "label": "pos"}]}
    )
    with pytest.raises(
        DataFormatError, match=r"text.test.pickle: item 0: label 'pos': expected an integer in \[0, 2\)"
    ):
        list(read_pickle(folder / "text.test.pickle", num_classes=2, pixels=False))


def test_pathfinder_metadata_names_a_file_name_that_is_not_utf8(pathfinder_release):
    metadata = sorted((pathfinder_release / "metadata").glob("*.npy"))[0]
    metadata.write_bytes(b"imgs/0 sample_\xff.png 0 1\n")
    with pytest.raises(DataFormatError) as error:
        pathfinder_metadata(pathfinder_release)
    assert str(error.value) == f"{metadata}:1: file: byte 0xff at position 8 is not utf-8 text"
