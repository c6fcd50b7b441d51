import argparse
import dataclasses
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from app_common.checkpoint import load_checkpoint, save_checkpoint
from app_common.config import add_dataclass_arguments, config_dict, config_from, read_toml
from app_common.device import autocast, resolve_dtype
from app_common.distributed import all_gather_object, all_reduce, setup_distributed, teardown_distributed
from app_common.measure import Timer, peak_memory
from app_common.progress import progress
from app_common.results import append_jsonl, read_jsonl
from app_common.seeding import CALIBRATION_SEED, rng_state, seed_everything, set_rng_state
from spectraformer_core import resolve_device


def test_auto_device_is_cpu_without_cuda_and_cuda_is_refused_then():
    if torch.cuda.is_available():
        assert resolve_device("auto").type == "cuda"
    else:
        assert resolve_device("auto") == torch.device("cpu")
        with pytest.raises(ValueError, match="device"):
            resolve_device("cuda")
    with pytest.raises(ValueError, match="device: expected one of auto, cpu, cuda"):
        resolve_device("tpu")


def test_dtype_names_and_autocast_computes_matmuls_in_bfloat16():
    assert resolve_dtype("bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("float16x")
    a = torch.randn(4, 4)
    with autocast(torch.device("cpu"), "bfloat16"):
        assert (a @ a).dtype == torch.bfloat16
    with autocast(torch.device("cpu"), "float32"):
        assert (a @ a).dtype == torch.float32


def test_saved_random_state_replays_every_generator_after_a_checkpoint_round_trip(tmp_path):
    seed_everything(3)
    state = rng_state()
    first = (random.random(), float(np.random.rand()), torch.rand(3))  # noqa: NPY002
    save_checkpoint(tmp_path / "rng.pt", {"rng": state})
    seed_everything(99)
    set_rng_state(load_checkpoint(tmp_path / "rng.pt")["rng"])
    again = (random.random(), float(np.random.rand()), torch.rand(3))  # noqa: NPY002
    assert first[:2] == again[:2]
    assert torch.equal(first[2], again[2])


def test_the_calibration_seed_of_the_apps_is_fixed():
    # vit-finetune's and gpt-uptrain's calibration batches (and so their recorded results) depend on it.
    assert CALIBRATION_SEED == 31_415_926


def test_checkpoint_is_replaced_atomically_and_missing_one_reads_as_none(tmp_path):
    path = tmp_path / "deep" / "ckpt.pt"
    assert load_checkpoint(path) is None
    save_checkpoint(path, {"step": 1, "w": torch.ones(2)})
    save_checkpoint(path, {"step": 2, "w": torch.zeros(2)})
    state = load_checkpoint(path)
    assert state["step"] == 2
    assert torch.equal(state["w"], torch.zeros(2))
    assert sorted(p.name for p in path.parent.iterdir()) == ["ckpt.pt"]  # no temporary left behind
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        load_checkpoint(path)


def test_jsonl_appends_records_in_order_and_skips_a_torn_last_line(tmp_path):
    path = tmp_path / "results" / "r.jsonl"
    assert read_jsonl(path, missing_ok=True) == []
    append_jsonl(path, {"a": 1, "path": Path("x/y"), "t": torch.tensor(2.5)})
    append_jsonl(path, {"a": 2})
    assert read_jsonl(path) == [{"a": 1, "path": "x/y", "t": 2.5}, {"a": 2}]
    with path.open("a") as f:
        f.write('{"a": 3, "trunc')
    assert [r["a"] for r in read_jsonl(path)] == [1, 2]
    path.write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    with pytest.raises(ValueError, match=r"r.jsonl:2: not valid JSON"):
        read_jsonl(path)
    with pytest.raises(FileNotFoundError):
        read_jsonl(tmp_path / "none.jsonl")
    with pytest.raises(TypeError, match="not JSON serializable"):
        append_jsonl(path, {"x": object()})


def test_timer_accumulates_over_intervals_and_continues_a_saved_total():
    timer = Timer(elapsed=10.0)
    with timer:
        sum(range(10000))
    first = timer.elapsed
    assert first > 10.0
    with timer:
        sum(range(10000))
    assert timer.elapsed > first
    with pytest.raises(RuntimeError, match="not running"):
        timer.stop()


def test_cpu_peak_memory_is_the_resident_set_and_grows_with_a_large_allocation():
    before = peak_memory(torch.device("cpu"))
    assert before.kind == "cpu_peak_rss"
    assert before.bytes > 10 * 2**20  # a Python process with torch loaded holds far more than 10 MiB
    big = torch.ones(64 * 2**20 // 4 + before.bytes // 4)  # touch more than the peak so far
    after = peak_memory(torch.device("cpu"))
    assert after.bytes >= before.bytes + 32 * 2**20
    del big


def test_one_process_context_without_torchrun(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    dist = setup_distributed("cpu")
    assert (dist.rank, dist.world_size, dist.is_main, dist.enabled) == (0, 1, True, False)
    assert all_gather_object({"x": 1}) == [{"x": 1}]
    assert torch.equal(all_reduce(torch.tensor([2.0]), "mean"), torch.tensor([2.0]))
    with pytest.raises(ValueError, match="op"):
        all_reduce(torch.tensor([1.0]), "prod")
    teardown_distributed()


_GLOO_WORKER = """
import json, sys
from pathlib import Path
import torch
from app_common.distributed import all_gather_object, all_reduce, setup_distributed, teardown_distributed

rank = int(sys.argv[1])
dist = setup_distributed("cpu")
total = all_reduce(torch.tensor([float(rank + 1)]), "sum")
biggest = all_reduce(torch.tensor([float(rank + 1)]), "max")
names = all_gather_object(f"rank{rank}")
Path(sys.argv[2], f"{rank}.json").write_text(
    json.dumps([dist.backend, dist.world_size, total.item(), biggest.item(), names])
)
teardown_distributed()
"""


def test_two_cpu_processes_join_a_gloo_group_and_reduce(tmp_path):
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        procs.append(
            subprocess.Popen([sys.executable, "-c", _GLOO_WORKER, str(rank), str(tmp_path)], env=env)
        )
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    for rank in range(2):
        backend, world, total, biggest, names = json.loads((tmp_path / f"{rank}.json").read_text())
        assert (backend, world, total, biggest, names) == ("gloo", 2, 3.0, 2.0, ["rank0", "rank1"])


@dataclass(frozen=True)
class _Config:
    task: str
    batch_size: int | None = field(default=None, metadata={"help": "examples per step"})
    lr: float = 1e-3
    out: Path = Path("runs")
    compile: bool = False
    features: tuple[int, ...] = (64, 128)
    dtype: str = field(default="float32", metadata={"choices": ("float32", "bfloat16")})


def _parser():
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, _Config)
    return parser


def test_flags_map_one_to_one_onto_fields_and_win_over_toml_over_defaults():
    parser = _parser()
    flags = {a.dest for a in parser._actions if a.dest != "help"}
    assert flags == {f.name for f in dataclasses.fields(_Config)}
    args = parser.parse_args(["--task", "t", "--lr", "0.5", "--compile", "--features", "1", "2", "3"])
    config = config_from(_Config, args, toml={"lr": 2, "batch_size": 8, "out": "x", "sub": {"k": 1}})
    assert config == _Config(
        task="t", batch_size=8, lr=0.5, out=Path("x"), compile=True, features=(1, 2, 3), dtype="float32"
    )
    assert config_dict(config)["out"] == "x"
    assert config_dict(config)["features"] == [1, 2, 3]


def test_bad_toml_keys_values_and_flags_are_named(tmp_path):
    with pytest.raises(ValueError, match="TOML key 'bacth_size'"):
        config_from(_Config, None, toml={"task": "t", "bacth_size": 3})
    with pytest.raises(ValueError, match="lr: expected a float"):
        config_from(_Config, None, toml={"task": "t", "lr": "fast"})
    with pytest.raises(SystemExit):
        _parser().parse_args(["--task", "t", "--dtype", "float8"])
    bad = tmp_path / "bad.toml"
    bad.write_text("lr = = 1")
    with pytest.raises(ValueError, match="not valid TOML"):
        read_toml(bad)
    good = tmp_path / "good.toml"
    good.write_text('task = "listops"\nlr = 0.25\n')
    assert config_from(_Config, None, toml=read_toml(good)).lr == 0.25


def test_progress_bar_counts_and_can_be_silenced(capsys):
    bar = progress(total=5, desc="x", disable=True)
    bar.update(3)
    bar.close()
    assert list(progress(range(3), disable=True)) == [0, 1, 2]
    assert capsys.readouterr().err == ""
