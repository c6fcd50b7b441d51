import pytest
import torch

from app_common.safetensors import read_safetensors, write_safetensors


def test_safetensors_round_trip_keeps_names_dtypes_shapes_and_values(tmp_path):
    tensors = {
        "w": torch.randn(3, 4),
        "h": torch.randn(2, dtype=torch.float64).half(),
        "b": torch.randn(5).bfloat16(),
        "i": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "m": torch.tensor([True, False]),
        "empty": torch.empty(0, 7),
    }
    loaded = read_safetensors(write_safetensors(tmp_path / "x.safetensors", tensors))
    assert set(loaded) == set(tensors)
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype
        assert torch.equal(loaded[name], tensor)


def test_bad_and_truncated_files_are_refused_with_the_path(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a file")
    with pytest.raises(ValueError, match=r"bad\.safetensors: not a readable safetensors file"):
        read_safetensors(bad)
    good = write_safetensors(tmp_path / "t.safetensors", {"w": torch.randn(100)})
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(good.read_bytes()[:-8])
    with pytest.raises(ValueError, match=r"cut\.safetensors: not a readable safetensors file"):
        read_safetensors(cut)


def test_only_the_tensors_kept_are_read(tmp_path):
    path = write_safetensors(tmp_path / "x.safetensors", {"body.w": torch.ones(2), "head.w": torch.zeros(3)})
    assert set(read_safetensors(path, keys=lambda name: not name.startswith("head."))) == {"body.w"}


TENSORS = {"w": torch.arange(12.0).reshape(3, 4), "b": torch.arange(4.0).bfloat16()}


def test_the_reference_library_reads_our_files(tmp_path):
    from safetensors.torch import load_file

    loaded = load_file(str(write_safetensors(tmp_path / "ours.safetensors", TENSORS)))
    assert all(torch.equal(loaded[k], v) for k, v in TENSORS.items())


def test_we_read_the_reference_librarys_files(tmp_path):
    from safetensors.torch import save_file

    save_file(TENSORS, str(tmp_path / "theirs.safetensors"))
    loaded = read_safetensors(tmp_path / "theirs.safetensors")
    assert all(torch.equal(loaded[k], v) for k, v in TENSORS.items())


def test_two_tensors_sharing_memory_are_both_written(tmp_path):
    weight = torch.randn(4, 4)
    loaded = read_safetensors(write_safetensors(tmp_path / "tied.safetensors", {"a": weight, "b": weight}))
    assert torch.equal(loaded["a"], loaded["b"])
