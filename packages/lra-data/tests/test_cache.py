import json
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import lra_data
from lra_data import (
    CacheError,
    GenerateConfig,
    ListOpsConfig,
    PrepareConfig,
    collate,
    generate,
    generate_listops,
    load,
    prepare,
    read_cifar10,
    read_imdb,
    read_listops_tsv,
    read_pathfinder,
    read_retrieval_tsv,
    split_seed,
    tokenize_listops,
)


def _same(dataset, examples):
    examples = list(examples)
    assert len(dataset) == len(examples)
    for i, (tokens, label) in enumerate(examples):
        got_tokens, got_label = dataset[i]
        assert got_label == label
        if isinstance(tokens, tuple):
            assert [t.tolist() for t in got_tokens] == [t.tolist() for t in tokens]
        else:
            assert got_tokens.dtype == torch.int64
            assert got_tokens.tolist() == tokens.tolist()


def test_listops_cache_holds_exactly_what_the_release_files_hold(tmp_path, listops_release):
    manifest = prepare(PrepareConfig("listops", tmp_path, tmp_path / "cache"))
    assert {s: e["count"] for s, e in manifest["splits"].items()} == {"train": 4, "val": 2, "test": 2}
    assert manifest["tokenization"]["vocab"] == list(lra_data.LISTOPS_VOCAB)
    assert manifest["max_length"] == 2000
    for split in ("train", "val", "test"):
        _same(
            load("listops", split, tmp_path / "cache"),
            read_listops_tsv(listops_release / f"basic_{split}.tsv"),
        )


def test_retrieval_cache_maps_eval_to_val_and_keeps_both_documents(tmp_path, retrieval_release):
    prepare(PrepareConfig("retrieval", tmp_path / "lra_release", tmp_path / "cache"))
    dataset = load("retrieval", "val", tmp_path / "cache")
    assert dataset.pair
    _same(dataset, read_retrieval_tsv(retrieval_release / "new_aan_pairs.eval.tsv"))
    assert dataset.lengths.shape == (3, 2)


def test_text_cache_truncates_reviews_to_4000_bytes_and_counts_them(tmp_path, imdb):
    (imdb / "train" / "pos" / "7_8.txt").write_bytes(b"a" * 4500)
    manifest = prepare(PrepareConfig("text", tmp_path, tmp_path / "cache"))
    assert set(manifest["splits"]) == {"train", "test"}
    assert manifest["splits"]["train"]["truncated"] == [1]
    assert manifest["splits"]["train"]["lengths"][0]["max"] == 4000
    train = load("text", "train", tmp_path / "cache")
    expected = [(t[:4000], label) for t, label in read_imdb(imdb, "train")]
    _same(train, expected)
    with pytest.raises(ValueError, match=r"split: 'val' is not in the cache .*; it has train, test"):
        load("text", "val", tmp_path / "cache")


def test_image_cache_holds_gray_pixels_plus_one(tmp_path, cifar):
    manifest = prepare(PrepareConfig("image", cifar, tmp_path / "cache"))
    assert {s: e["count"] for s, e in manifest["splits"].items()} == {"train": 9, "val": 1, "test": 2}
    for split in ("train", "val", "test"):
        _same(load("image", split, tmp_path / "cache"), read_cifar10(cifar, split))
    black = load("image", "train", tmp_path / "cache")[0][0]
    assert black.tolist() == [1] * 1024


def test_pathfinder_cache_finds_the_difficulty_folder_below_the_release(tmp_path, pathfinder_release):
    manifest = prepare(PrepareConfig("pathfinder", tmp_path, tmp_path / "cache", split_seed=3))
    assert manifest["source"]["difficulty"] == "curv_contour_length_14"
    assert {s: e["count"] for s, e in manifest["splits"].items()} == {"train": 16, "val": 2, "test": 2}
    _same(load("pathfinder", "test", tmp_path / "cache"), read_pathfinder(pathfinder_release, "test", seed=3))


def test_pathfinder_refuses_a_folder_of_another_difficulty(tmp_path, pathfinder_release):
    with pytest.raises(ValueError, match=r"is the 'curv_contour_length_14' folder, but difficulty='easy'"):
        prepare(PrepareConfig("pathfinder", pathfinder_release, tmp_path / "cache", difficulty="easy"))


def test_missing_source_data_names_every_place_looked_at(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no listops data at .*empty; looked for .*basic_train.tsv"):
        prepare(PrepareConfig("listops", tmp_path / "empty", tmp_path / "cache"))


def test_pickled_image_cache_shifts_pixels_and_maps_dev_to_val(tmp_path, lra_files):
    rows = [{"input_ids_0": np.arange(1024) % 256, "label": k} for k in range(3)]
    folder = lra_files.write_pickles(tmp_path, "image", {"train": rows, "dev": rows[:1], "test": rows[:2]})
    manifest = prepare(PrepareConfig("image", folder, tmp_path / "cache"))
    assert manifest["source"]["kind"] == "pickle"
    assert {s: e["count"] for s, e in manifest["splits"].items()} == {"train": 3, "val": 1, "test": 2}
    tokens, label = load("image", "val", tmp_path / "cache")[0]
    assert tokens.tolist() == (np.arange(1024) % 256 + 1).tolist()
    assert label == 0


def test_pickled_listops_cache_keeps_the_pickles_ids_without_padding(tmp_path, lra_files):
    rows = [{"input_ids_0": np.array([4, 17, 2, 0, 0]), "label": 3}]
    folder = lra_files.write_pickles(tmp_path, "listops", {"train": rows})
    manifest = prepare(PrepareConfig("listops", folder, tmp_path / "cache", format="pickle"))
    assert manifest["tokenization"]["scheme"] == "pickle"
    assert manifest["tokenization"]["vocab_size"] == 18
    assert load("listops", "train", tmp_path / "cache")[0][0].tolist() == [4, 17, 2]


def test_existing_cache_is_not_overwritten_without_asking(tmp_path, listops_release):
    prepare(PrepareConfig("listops", tmp_path, tmp_path / "cache"))
    with pytest.raises(FileExistsError, match=r"cache/listops/manifest.json: a cache is already there"):
        prepare(PrepareConfig("listops", tmp_path, tmp_path / "cache"))
    prepare(PrepareConfig("listops", tmp_path, tmp_path / "cache", overwrite=True))


@pytest.fixture
def listops_cache(tmp_path, listops_release):
    prepare(PrepareConfig("listops", tmp_path, tmp_path / "cache"))
    return tmp_path / "cache" / "listops"


def test_a_flipped_byte_in_the_tokens_is_refused_by_its_checksum(listops_cache):
    path = listops_cache / "train.tokens_0.bin"
    data = bytearray(path.read_bytes())
    data[3] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(CacheError, match=r"train.tokens_0.bin: SHA-256 does not match the manifest"):
        load("listops", "train", listops_cache.parent)
    load("listops", "val", listops_cache.parent)  # the other splits are intact


def test_a_truncated_file_is_refused_even_without_checksums(listops_cache):
    path = listops_cache / "train.tokens_0.bin"
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(CacheError, match=r"train.tokens_0.bin: \d+ bytes, expected \d+ \(\d+ x uint16\)"):
        load("listops", "train", listops_cache.parent, verify=False)


def test_token_ids_outside_the_vocabulary_are_refused_without_checksums(listops_cache):
    # Same size, so only the checksum (skipped here) would notice; the ids are then checked as read.
    path = listops_cache / "train.tokens_0.bin"
    tokens = np.fromfile(path, dtype=np.uint16)
    tokens[5] = 40000
    tokens.tofile(path)
    train = load("listops", "train", listops_cache.parent, verify=False)
    offsets = np.fromfile(listops_cache / "train.offsets_0.bin", dtype=np.int64)
    damaged = int(np.searchsorted(offsets, 5, side="right")) - 1
    for i in range(len(train)):
        if i != damaged:
            assert int(train[i][0].max()) < train.vocab_size
    with pytest.raises(
        CacheError,
        match=rf"train.tokens_0.bin: example {damaged} holds token ids \d+..40000, outside the vocabulary "
        rf"\[0, {train.vocab_size}\)",
    ):
        train[damaged]


def test_a_missing_data_file_is_refused(listops_cache):
    (listops_cache / "test.labels.bin").unlink()
    with pytest.raises(CacheError, match=r"test.labels.bin: listed in the manifest but missing"):
        load("listops", "test", listops_cache.parent)


def test_a_manifest_that_does_not_match_is_refused(listops_cache):
    path = listops_cache / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["splits"]["train"]["count"] = 5
    path.write_text(json.dumps(manifest))
    with pytest.raises(CacheError, match=r"split 'train' has 4 labels, expected 5"):
        load("listops", "train", listops_cache.parent)
    manifest["task"] = "text"
    path.write_text(json.dumps(manifest))
    with pytest.raises(CacheError, match=r"holds task 'text', expected 'listops'"):
        load("listops", "train", listops_cache)
    path.write_text("{ not json")
    with pytest.raises(CacheError, match=r"manifest.json: not valid JSON"):
        load("listops", "train", listops_cache.parent)
    path.write_text(json.dumps({"format": "lra-data-cache", "version": 99}))
    with pytest.raises(CacheError, match=r"expected cache version 1, got 99"):
        load("listops", "train", listops_cache.parent)


def test_load_names_the_missing_cache_and_the_known_tasks(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"listops/manifest.json: no such file .*lra-data prepare --task listops"
    ):
        load("listops", "train", tmp_path)
    with pytest.raises(
        ValueError,
        match=r"task: unknown 'cifar'; expected one of listops, text, retrieval, image, pathfinder",
    ):
        load("cifar", "train", tmp_path)


def test_dataset_pickles_without_copying_the_token_arrays(listops_cache):
    dataset = load("listops", "train", listops_cache.parent)
    clone = pickle.loads(pickle.dumps(dataset))
    assert clone._tokens[0] is not dataset._tokens[0]
    assert clone[2][0].tolist() == dataset[2][0].tolist()
    assert isinstance(clone._tokens[0], np.memmap)


def test_dataset_indexing_supports_negative_indices_and_refuses_out_of_range(listops_cache):
    dataset = load("listops", "train", listops_cache.parent)
    assert dataset[-1][1] == dataset[3][1]
    with pytest.raises(IndexError, match="index: 4 out of range for listops/train with 4 examples"):
        dataset[4]


def test_writer_refuses_padding_tokens_and_labels_out_of_range(tmp_path):
    def writer():
        return lra_data.CacheWriter(
            tmp_path / "c", task="t", num_classes=2, max_length=8, pair=False,
            tokenization={"vocab_size": 5}, source={}, overwrite=True,
        )  # fmt: skip

    with pytest.raises(
        ValueError, match=r"train\[1\]: token ids 0..3: expected ids in \[1, 5\) \(0 is padding only\)"
    ):
        writer().write_split("train", [(np.array([1, 2]), 0), (np.array([3, 0]), 1)])
    with pytest.raises(ValueError, match=r"train\[0\]: label 2: expected an integer in \[0, 2\)"):
        writer().write_split("train", [(np.array([1]), 2)])
    assert not (tmp_path / "c" / "train.tokens_0.bin").exists()  # no half-written split is left


def test_generated_listops_cache_equals_the_generator_with_the_split_seed(tmp_path):
    config = ListOpsConfig(max_depth=5, max_args=5, min_length=10, max_length=80)
    manifest = generate(GenerateConfig("listops", 30, tmp_path, seed=4, listops=config))
    assert {s: e["count"] for s, e in manifest["splits"].items()} == {"train": 30, "val": 3, "test": 3}
    assert manifest["source"]["config"]["min_length"] == 10
    pairs = generate_listops(
        30, seed=split_seed(4, "listops", "train"), max_depth=5, max_args=5, min_length=10, max_length=80
    )
    _same(load("listops", "train", tmp_path), [(tokenize_listops(s), label) for s, label in pairs])
    val = [lra_data.detokenize_listops(t) for t, _ in load("listops", "val", tmp_path)]
    assert not set(val) & {lra_data.detokenize_listops(tokenize_listops(s)) for s, _ in pairs}


def test_generated_pathfinder_cache_holds_1024_pixel_tokens(tmp_path):
    generate(GenerateConfig("pathfinder", 6, tmp_path, val=2, test=2))
    dataset = load("pathfinder", "train", tmp_path)
    assert len(dataset) == 6
    assert dataset.lengths.tolist() == [1024] * 6
    assert sorted(dataset.labels.tolist()) == [0, 0, 0, 1, 1, 1]
    tokens, _ = dataset[0]
    assert tokens.min() >= 1
    assert tokens.max() == 256


def test_generate_refuses_tasks_without_a_generator(tmp_path):
    with pytest.raises(
        ValueError, match=r"task: no generator for 'text'; expected one of listops, pathfinder"
    ):
        generate(GenerateConfig("text", 5, tmp_path))


def test_generate_refuses_a_split_of_no_examples(tmp_path):
    with pytest.raises(ValueError, match=r"^val: expected an integer >= 1, got 0$"):
        generate(GenerateConfig("listops", 5, tmp_path, val=0))


def test_dataloader_batches_a_cache_with_collate(listops_cache):
    dataset = load("listops", "train", listops_cache.parent)
    batch = next(iter(DataLoader(dataset, batch_size=4, collate_fn=collate)))
    lengths = dataset.lengths
    assert batch.tokens.shape == (4, int(lengths.max()))
    assert batch.key_padding_mask.sum(1).tolist() == (lengths.max() - lengths).tolist()
    assert batch.labels.tolist() == dataset.labels.tolist()
