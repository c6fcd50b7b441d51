import pytest
import torch

from app_common import read_safetensors, write_safetensors


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
    assert list(loaded) == list(tensors)
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype
        assert torch.equal(loaded[name], tensor)


def test_bad_and_truncated_files_are_refused_with_the_path(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a file")
    with pytest.raises(ValueError, match=r"bad\.safetensors: not a safetensors file"):
        read_safetensors(bad)
    good = write_safetensors(tmp_path / "t.safetensors", {"w": torch.randn(100)})
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(good.read_bytes()[:-8])
    with pytest.raises(ValueError, match=r"cut\.safetensors: tensor 'w' runs past the end"):
        read_safetensors(cut)
