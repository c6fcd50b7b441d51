import dataclasses
import os
import subprocess
import sys

import pytest

from app_common.results import read_jsonl
from lra_bench import train


def test_two_gloo_processes_follow_the_one_process_loss_trajectory(tmp_path, data, helpers):
    # No dropout: the processes draw different dropout masks than one process would.
    config = helpers.tiny_config(
        tmp_path / "one", data=data, steps=8, eval_every=4, dropout=0.0, attention_dropout=0.0
    )
    one = train(config)
    two_dir = tmp_path / "two"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "-m", "lra_bench", "train",
        "--task", "listops", "--attention", "softmax", "--attention-features", "16", "--device", "cpu",
        "--data", str(data), "--out", str(two_dir),
        "--batch-size", "8", "--lr", "1e-3", "--warmup-steps", "2", "--eval-every", "4",
        "--eval-batches", "2", "--init-steps", "0", "--max-length", "32", "--steps", "8", "--dim", "32",
        "--embedding-dim", "32", "--hidden-dim", "32", "--log-every", "1", "--dropout", "0",
        "--attention-dropout", "0",
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (two,) = read_jsonl(two_dir / "results.jsonl")
    assert two["world_size"] == 2
    assert two["name"] == one["name"]
    logs = [
        read_jsonl(helpers.run_dir(c) / "log.jsonl")
        for c in (config, dataclasses.replace(config, out=two_dir))
    ]
    losses = [[r["train_loss"] for r in log if "train_loss" in r] for log in logs]
    assert len(losses[0]) == len(losses[1]) == 8
    assert losses[1] == pytest.approx(losses[0], rel=1e-4, abs=1e-5)
    assert [r for r in logs[1] if "val_accuracy" in r] == [r for r in logs[0] if "val_accuracy" in r]
    assert two["metrics"]["test_accuracy"] == one["metrics"]["test_accuracy"]
