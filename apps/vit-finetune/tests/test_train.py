"""Training runs on the tiny ViT and digits: the loss falls, a killed run resumes, the CLI and the report."""

import math

import pytest
import torch

from app_common.records import CORE_KEYS
from app_common.results import read_jsonl
from app_common.testing import assert_resume_equals_unbroken
from vit_finetune import TrainConfig
from vit_finetune.cli import main
from vit_finetune.config import ReportConfig
from vit_finetune.report import report


def config(tmp_path, **kw):
    base = {
        "data": "digits",
        "model": "vit-tiny-test",
        "image_size": 8,
        "layer": "ralimp",
        "last_k": 2,
        "features": 16,
        "batch_size": 32,
        "lr": 3e-3,
        "steps": 24,
        "eval_every": 8,
        "log_every": 4,
        "throughput_batch": 8,
        "throughput_repeats": 1,
        "device": "cpu",
        "tune": True,
        "results": tmp_path / "results.jsonl",
    }
    return TrainConfig(**{**base, "out": tmp_path, **kw})


def test_a_tiny_fine_tune_lowers_the_loss(tmp_path):
    from vit_finetune.train import train

    # The calibrated start, which --init auto takes for pretrained weights (this tiny model has none).
    record = train(config(tmp_path, steps=40, lr=1e-2, eval_every=20, init="lstsq"))
    assert set(CORE_KEYS) <= set(record)
    metrics, details = record["metrics"], record["details"]
    # The head starts at zero, so the loss before training is exactly ln(10) on any data.
    assert metrics["eval_loss"] < math.log(10) - 0.15
    log = read_jsonl(details["log"])
    losses = [r["train_loss"] for r in log if "train_loss" in r]
    assert losses[-1] < losses[0]
    assert details["replaced"] == ["blocks.2.mlp", "blocks.3.mlp"]
    assert record["steps"] == 40
    assert details["init"] == "lstsq"
    assert details["layer_options"] == {"balance": "auto"}  # the recorded departure (ralimp, the default)
    assert details["eval_split"] == "val"
    assert details["parameters_compressed"] < details["parameters_dense"]
    assert details["throughput"] > 0
    assert details["throughput_dense"] > 0
    assert read_jsonl(tmp_path / "results.jsonl")[-1]["name"] == record["name"]


@pytest.mark.parametrize("kill_step", [8, 24])
def test_a_killed_run_resumes_bit_identical_to_an_unbroken_one(tmp_path, kill_step):
    from vit_finetune.train import train

    def run(out, on_save):
        settings = {"attention": "performer", "attention_features": 16, "dropout": 0.1, "augment": True}
        return train(config(out, **settings, out=out), on_checkpoint=on_save)

    clock = ("throughput", "throughput_compressed", "throughput_dense")
    assert_resume_equals_unbroken(run, tmp_path, kill_step=kill_step, clock_keys=clock)
    assert run(tmp_path / "broken", None) is None  # finished: nothing to do


def tiny_args(command, tmp_path, *flags):
    """``command`` with ``flags`` on the tiny ViT on the CPU, writing under ``tmp_path``."""
    where = ["--device", "cpu", "--out", str(tmp_path), "--results", str(tmp_path / "r.jsonl")]
    return [command, "--model", "vit-tiny-test", "--image-size", "8", *where, *flags]


def test_cli_sweep_and_report_write_the_table_and_plots(tmp_path, capsys):
    flags = ["--layer", "dense", "eugen", "--last-k", "1", "2", "--data", "digits", "--batch-size", "32"]
    flags += ["--steps", "4", "--throughput-batch", "4", "--throughput-repeats", "1", "--features", "8"]
    assert main(tiny_args("sweep", tmp_path, *flags)) == 0
    records = read_jsonl(tmp_path / "r.jsonl")
    pairs = sorted((r["details"]["layer"], r["details"]["last_k"]) for r in records)
    assert pairs == [("dense", 0), ("eugen", 1), ("eugen", 2)]
    table = report(ReportConfig(results=tmp_path / "r.jsonl"))
    assert "| dense" in table
    assert "eugen" in table
    for name in ("table.md", "table.csv", "curves.png", "accuracy_vs_k.png"):
        assert (tmp_path / "report" / name).is_file()
    capsys.readouterr()
    assert main(["list", "layers"]) == 0
    assert capsys.readouterr().out.split() == ["dense", "eugen", "lowrank", "ralimp", "snnk"]
    assert main(["list"]) == 0  # every kind, under its heading
    assert "layers:" in capsys.readouterr().out


def test_cli_errors_name_the_setting(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(tiny_args("train", tmp_path, "--layer", "mlp", "--steps", "1"))
    assert exit_info.value.code == 2
    assert "layer: unknown 'mlp'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--warmup-steps: expected an integer >= 0"):
        TrainConfig(warmup_steps=-1)


def test_the_calibrated_start_and_the_weight_matrix_reach_the_replaced_layers(tmp_path):
    from vit_finetune.train import train

    record = train(config(tmp_path, layer="eugen", weight_matrix="orf", steps=2, eval_every=2, init="lstsq"))
    assert record["details"]["init"] == "lstsq"
    checkpoint = torch.load(tmp_path / "runs" / record["name"] / "checkpoint.pt", weights_only=True)
    assert checkpoint["identity"]["weight_matrix"] == "orf"
    assert checkpoint["identity"]["init"] == "lstsq"
    # auto: the calibrated start for pretrained weights, Psi(W) for this randomly initialized model.
    assert train(config(tmp_path / "auto", layer="eugen", steps=2, eval_every=2))["details"]["init"] == "psi"
    with pytest.raises(ValueError, match="--init: expected one of auto, lstsq, psi"):
        TrainConfig(init="exact")


def test_the_app_keeps_to_the_flag_vocabulary_and_has_no_import_cycle():
    from app_common.testing import assert_app_contract
    from vit_finetune.cli import build_parser

    assert_app_contract(build_parser(), "vit_finetune")


def test_the_calibration_batch_is_ralimps_4096_rows():
    from vit_finetune.train import CALIBRATION_TOKENS

    assert CALIBRATION_TOKENS == 4096
