import json
import sys
import types

import numpy as np
import pytest

from gpt_uptrain import TokenData, prepare, stdlib_files


def test_prepare_writes_nanogpt_uint16_files_that_decode_back_to_the_text(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("héllo wörld\n" * 30)
    b.write_text("second file " * 30)
    for name in ("char", "byte"):
        meta = prepare([a, b], tmp_path / name, tokenizer=name, val_fraction=0.2)
        train = np.fromfile(tmp_path / name / "train.bin", dtype=np.uint16)
        val = np.fromfile(tmp_path / name / "val.bin", dtype=np.uint16)
        assert (len(train), len(val)) == (meta["train_tokens"], meta["val_tokens"])
        assert len(val) == int((len(train) + len(val)) * 0.2)
        data = TokenData(tmp_path / name)
        text = data.tokenizer().decode(np.concatenate([train, val]).tolist())
        assert text == a.read_text() + "\n" + b.read_text()
        assert json.loads((tmp_path / name / "meta.json").read_text())["tokenizer"] == name
    assert meta["vocab_size"] == 256


def test_batches_are_a_function_of_the_seed_tuple_and_shift_by_one(data):
    tokens = TokenData(data)
    x, y = tokens.batch("train", 4, 16, seed=(0, 3, 1))
    x2, y2 = tokens.batch("train", 4, 16, seed=(0, 3, 1))
    x3, _ = tokens.batch("train", 4, 16, seed=(0, 3, 2))
    assert x.shape == y.shape == (4, 16)
    assert (x == x2).all()
    assert (y == y2).all()
    assert not (x == x3).all()
    assert (x[:, 1:] == y[:, :-1]).all()


def _fake_tiktoken(monkeypatch, error):
    def get_encoding(name):
        raise error

    monkeypatch.setitem(sys.modules, "tiktoken", types.SimpleNamespace(get_encoding=get_encoding))


def test_gpt2_bpe_offline_fails_with_a_message_that_says_what_to_do(tmp_path, monkeypatch):
    corpus = tmp_path / "c.txt"
    corpus.write_text("some text " * 10)
    _fake_tiktoken(monkeypatch, ConnectionError("Failed to resolve 'openaipublic.blob.core.windows.net'"))
    with pytest.raises(
        RuntimeError, match=r"could not load the GPT-2 encoding.*--tokenizer char or --tokenizer byte"
    ):
        prepare([corpus], tmp_path / "out", tokenizer="gpt2")
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # not installed
    with pytest.raises(RuntimeError, match=r"gpt-uptrain\[bpe\]"):
        prepare([corpus], tmp_path / "out", tokenizer="gpt2")
    assert not (tmp_path / "out").exists()


def test_the_stdlib_corpus_rule_is_fixed_and_offline():
    files = stdlib_files(200_000)
    assert files == sorted(files)
    assert files == stdlib_files(200_000)
    assert all(f.suffix == ".py" and f.read_bytes().isascii() for f in files)
    sizes = [f.stat().st_size for f in files]
    assert sum(sizes[:-1]) < 200_000 <= sum(sizes)


def test_bad_data_is_reported_with_the_path(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"train.bin is missing; build the folder with `gpt-uptrain prepare`"
    ):
        TokenData(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"files: .*nope\.txt does not exist"):
        prepare([tmp_path / "nope.txt"], tmp_path / "out")
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        prepare([tmp_path / "bin.txt"], tmp_path / "out")
    with pytest.raises(ValueError, match="unknown tokenizer 'words'"):
        prepare([tmp_path / "bin.txt"], tmp_path / "out", tokenizer="words")
