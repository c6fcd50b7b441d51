import dataclasses
import math
import os
import subprocess
import sys

import pytest

from app_common.checkpoint import load_checkpoint, save_checkpoint
from app_common.records import flat_record, run_dir
from app_common.results import read_jsonl
from app_common.testing import Killed, assert_resume_equals_unbroken, kill_at
from gpt_uptrain import (
    SampleConfig,
    learning_rate,
    load_model,
    prepare,
    report,
    sample,
    save_pretrained,
    train,
)
from gpt_uptrain.cli import main
from gpt_uptrain.model import GPT, GPTConfig
from gpt_uptrain.train import run_name, training_memory


def _dir(config):
    return run_dir(config.out, run_name(config))


def _log(config):
    return read_jsonl(_dir(config) / "log.jsonl")


@pytest.mark.parametrize("layer", ["dense", "ralimp", "eugen", "snnk"])
def test_a_tiny_run_lowers_the_loss(tmp_path, data, helpers, layer):
    config = helpers.tiny_config(tmp_path, data, layer=layer, last_k=1, steps=40, eval_every=40)
    record = flat_record(train(config))
    first = _log(config)[0]
    assert first["step"] == 1
    # from ln(vocab) ~ 3.4 to ~2.6 or below (SNNK, the slowest: 2.58 under the shared warm-up rule)
    assert record["val_loss"] < first["train_loss"] - 0.75
    assert record["val_ppl"] == pytest.approx(math.exp(record["val_loss"]))
    assert record["replaced"] == ([] if layer == "dense" else ["transformer.h.1.mlp"])
    # the recorded departure: without it SNNK's loss stays at ln(vocab)
    assert record["layer_options"].get("balance") == ("auto" if layer in ("ralimp", "snnk") else None)


def test_transfer_steps_lower_every_layers_attention_mse_before_fine_tuning(tmp_path, data, helpers):
    config = helpers.tiny_config(tmp_path, data, attention="posrf-orf", transfer_steps=20, transfer_lr=3e-2)
    transfer = train(config)["details"]["transfer"]
    assert transfer["steps"] == 20
    assert len(transfer["mse_before"]) == len(transfer["mse_after"]) == config.model.n_layer
    assert all(a < b for a, b in zip(transfer["mse_after"], transfer["mse_before"], strict=True))


def test_transfer_steps_make_the_attention_learnable(tmp_path, data, helpers):
    config = helpers.tiny_config(tmp_path, data, attention="posrf-orf", transfer_steps=1, steps=3)
    train(config)
    model, _ = load_model(_dir(config) / "checkpoint.pt")
    assert model.config.learnable_attention
    assert any(n.endswith("feature_map.weight_matrix.weight") for n, _ in model.named_parameters())


def test_transfer_steps_need_a_random_feature_attention(tmp_path, data, helpers):
    with pytest.raises(ValueError, match="--transfer-steps"):
        helpers.tiny_config(tmp_path, data, transfer_steps=5)


def test_learnable_attention_needs_a_random_feature_attention():
    with pytest.raises(ValueError, match="learnable_attention"):
        GPTConfig(attention="softmax", learnable_attention=True)


def test_a_killed_run_with_attention_transfer_resumes_bit_identical_to_an_unbroken_one(
    tmp_path, data, helpers
):
    def run(out, on_save):
        config = helpers.tiny_config(out, data, attention="oprf-orf", transfer_steps=3)
        return train(
            dataclasses.replace(config, out=out, results=out / "results.jsonl"), on_checkpoint=on_save
        )

    assert_resume_equals_unbroken(run, tmp_path, kill_step=3)


@pytest.mark.parametrize("kill_step", [3, 6])
def test_a_killed_run_resumes_bit_identical_to_an_unbroken_one(tmp_path, data, helpers, kill_step):
    # Dropout and a causal OPRF attention (running statistics) make the random and buffer state matter.
    options = {"layer": "ralimp", "last_k": 1, "attention": "oprf-orf", "dropout": 0.1}

    def run(out, on_save):
        config = helpers.tiny_config(out, data, **options)
        return train(
            dataclasses.replace(config, out=out, results=out / "results.jsonl"), on_checkpoint=on_save
        )

    assert_resume_equals_unbroken(run, tmp_path, kill_step=kill_step)


def test_a_finished_run_is_skipped_and_a_checkpoint_of_other_settings_is_refused(tmp_path, data, helpers):
    config = helpers.tiny_config(tmp_path, data, layer="ralimp", last_k=1)
    train(config)
    assert train(config) is None  # finished: nothing left to do
    with pytest.raises(Killed):
        train(dataclasses.replace(config, resume=False), on_checkpoint=kill_at(3))
    path = _dir(config) / "checkpoint.pt"
    state = load_checkpoint(path)
    state["identity"]["lr"] = 0.002  # as if the folder held a run under another learning rate
    save_checkpoint(path, state)
    with pytest.raises(ValueError, match=r"saved by a run with other settings \(lr: 0\.002 -> 0\.003\)"):
        train(config)
    assert train(dataclasses.replace(config, resume=False))["steps"] == 6  # --no-resume: over


def test_learning_rate_warms_up_then_follows_the_cosine_to_min_lr(tmp_path, helpers):
    config = helpers.tiny_config(tmp_path, tmp_path, lr=6e-4, min_lr=6e-5, warmup_steps=500, steps=30_000)
    assert learning_rate(0, config) == pytest.approx(6e-4 / 500)
    assert learning_rate(499, config) == pytest.approx(6e-4)
    assert learning_rate(500, config) == pytest.approx(6e-4)
    assert learning_rate(15_250, config) == pytest.approx((6e-4 + 6e-5) / 2)
    assert learning_rate(30_000, config) == pytest.approx(6e-5)


def test_sample_generates_text_from_a_checkpoint_trained_with_an_rf_attention(tmp_path, data, helpers):
    config = helpers.tiny_config(tmp_path, data, attention="performer", layer="eugen", last_k=1, steps=3)
    train(config)
    texts = sample(
        SampleConfig(
            checkpoint=_dir(config) / "checkpoint.pt",
            prompt="the ",
            max_new_tokens=25,
            num_samples=2,
            device="cpu",
        )
    )
    assert len(texts) == 2
    assert all(t.startswith("the ") and len(t) == 29 for t in texts)
    with pytest.raises(ValueError, match="--attention applies to Hugging Face folders"):
        sample(SampleConfig(checkpoint=_dir(config) / "checkpoint.pt", attention="performer", device="cpu"))
    missing = tmp_path / "nonexistent"
    with pytest.raises(FileNotFoundError, match=f"checkpoint: no file or folder at {missing}"):
        sample(SampleConfig(checkpoint=missing, attention="perfomer", device="cpu"))


def test_sample_runs_an_hf_gpt2_with_an_rf_attention(tmp_path):
    model = GPT(GPTConfig(block_size=16, vocab_size=256, n_layer=2, n_head=2, n_embd=16))
    folder = save_pretrained(model, tmp_path / "hf")
    config = SampleConfig(
        checkpoint=folder,
        attention="oprf-orf",
        tokenizer="byte",
        prompt="ab",
        max_new_tokens=20,
        device="cpu",
    )
    (text,) = sample(config)
    assert text.startswith("ab")


def test_report_writes_the_table_and_the_loss_curves(tmp_path, data, helpers):
    for layer in ("dense", "snnk"):
        train(
            helpers.tiny_config(
                tmp_path / layer, data, layer=layer, last_k=1, results=tmp_path / "results.jsonl"
            )
        )
    text = report(tmp_path / "results.jsonl", tmp_path / "report")
    assert "| dense " in text
    assert "| snnk (k=1) " in text
    assert "Val perplexity" in text
    assert (tmp_path / "report" / "loss_curves.png").stat().st_size > 1000
    assert (tmp_path / "report" / "table.csv").read_text().count("\n") == 3


def test_cli_trains_and_reports_errors_with_the_argument(tmp_path, data, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--help"])
    assert exit_.value.code == 0
    help_text = capsys.readouterr().out
    assert "--gradient-accumulation-steps" in help_text
    assert "``" not in help_text
    assert ":class:" not in help_text
    assert "--vocab-size" not in help_text
    assert "auto (CUDA when there is one), cpu, cuda or cuda:<index>" in " ".join(help_text.split())
    assert (
        main(
            [
                "prepare",
                str(data.parent / "corpus.txt"),
                "--data",
                str(tmp_path / "d2"),
                "--tokenizer",
                "byte",
            ]
        )
        == 0
    )
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--data", str(tmp_path / "missing"), "--device", "cpu"])
    assert exit_.value.code == 2
    assert "train.bin is missing" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "train",
                "--data",
                str(data),
                "--weights",
                str(tmp_path / "no-model"),
                "--device",
                "cpu",
                "--out",
                str(tmp_path / "r"),
            ]
        )
    assert "no Hugging Face checkpoint folder" in capsys.readouterr().err


# lstsq: a fitted readout leaves W, b and the fit's coefficients out of the output; DDP refuses parameters
# that require a gradient and get none, so ralimp freezes them
@pytest.mark.parametrize("init", ["psi", "lstsq"])
def test_two_gloo_processes_follow_the_one_process_loss_trajectory(tmp_path, data, helpers, init):
    config = helpers.tiny_config(
        tmp_path / "one", data, layer="ralimp", last_k=1, steps=4, eval_every=2, init=init
    )
    one = train(config)
    two = tmp_path / "two"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "-m", "gpt_uptrain", "train", "--data", str(data), "--out", str(two / "run"),
        "--results", str(two / "results.jsonl"),
        "--device", "cpu", "--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--block-size", "16",
        "--batch-size", "4", "--gradient-accumulation-steps", "2", "--steps", "4", "--warmup-steps", "1",
        "--lr", "3e-3", "--min-lr", "3e-4", "--eval-every", "2", "--eval-batches", "2",
        "--log-every", "1", "--features", "24", "--seed", "0", "--layer", "ralimp", "--last-k", "1",
        "--init", init,
    ]  # fmt: skip
    done = subprocess.run(
        command, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (record,) = read_jsonl(two / "results.jsonl")
    assert record["world_size"] == 2
    logs = [read_jsonl(run_dir(out, run_name(config)) / "log.jsonl") for out in (config.out, two / "run")]
    losses = [[r["train_loss"] for r in log if "train_loss" in r] for log in logs]
    assert len(losses[1]) == 4
    assert losses[1] == pytest.approx(losses[0], rel=1e-4, abs=1e-5)
    assert record["metrics"]["val_loss"] == pytest.approx(one["metrics"]["val_loss"], rel=1e-4, abs=1e-5)


def test_uptraining_from_an_hf_folder_starts_from_its_weights(tmp_path, helpers):
    corpus = tmp_path / "c.txt"
    corpus.write_text("uptraining reads a local checkpoint. " * 60)
    data = tmp_path / "bytes"
    prepare([corpus], data, tokenizer="byte")
    pretrained = GPT(GPTConfig(block_size=32, vocab_size=256, n_layer=2, n_head=2, n_embd=32))
    folder = save_pretrained(pretrained, tmp_path / "hf")
    config = helpers.tiny_config(
        tmp_path, data, weights=str(folder), layer="ralimp", last_k=1, steps=2, eval_every=2
    )
    record = flat_record(train(config))
    assert record["init"] == "lstsq"  # auto: the calibrated start for pretrained MLPs
    assert dataclasses.replace(config, weights="scratch").start == "psi"
    assert record["weights"] == str(folder)
    assert record["replaced"] == ["transformer.h.1.mlp"]
    model, meta = load_model(_dir(config) / "checkpoint.pt")
    assert meta["tokenizer"] == "byte"
    assert model.config.block_size == 16  # cropped from 32
    # Two small steps away from the pretrained weights, not a fresh initialization.
    before = pretrained.transformer.h[0].mlp.c_fc.weight
    after = model.transformer.h[0].mlp.c_fc.weight
    assert (after - before).abs().max() < 0.05 < before.abs().max()
    too_small = save_pretrained(
        GPT(GPTConfig(block_size=32, vocab_size=8, n_layer=1, n_head=2, n_embd=8)), tmp_path / "s"
    )
    with pytest.raises(ValueError, match="does not fit the pretrained model's 8"):
        train(dataclasses.replace(config, weights=str(too_small), out=tmp_path / "small"))


def test_bfloat16_autocast_trains(tmp_path, data, helpers):
    # The CUDA precision path, exercised with CPU autocast: a replaced MLP and a causal RF attention.
    config = helpers.tiny_config(
        tmp_path,
        data,
        dtype="bfloat16",
        layer="ralimp",
        last_k=1,
        attention="oprf-orf",
        steps=20,
        eval_every=20,
    )
    record = train(config)
    assert record["dtype"] == "bfloat16"
    assert record["metrics"]["val_loss"] < _log(config)[0]["train_loss"] - 0.45  # 2.88 from 3.38


def test_a_model_too_large_for_the_device_is_refused_before_it_is_built(tmp_path, data, helpers):
    # GPT-2 Large's blocks on 100,000 sequences of 128 tokens per micro-step: ~40 TB by the estimate.
    config = helpers.tiny_config(tmp_path, data, block_size=128, n_layer=36, n_head=20, n_embd=1280)
    config = dataclasses.replace(config, batch_size=100_000)
    with pytest.raises(MemoryError, match=r"needs about \d+\.\d GB .* lower --batch-size"):
        train(config)
    assert not (_dir(config) / "checkpoint.pt").exists()


def test_training_memory_counts_parameters_activations_and_logits():
    model = GPTConfig(block_size=1024, vocab_size=50257, n_layer=36, n_head=20, n_embd=1280)
    need = training_memory(model, 24, "float32")
    assert need["parameters"] == 16 * model.num_parameters()
    assert model.num_parameters() == pytest.approx(774e6, rel=0.01)  # GPT-2 Large
    assert need["activations"] == 68 * 36 * 24 * 1024 * 1280
    assert need["logits"] == 12 * 24 * 1024 * 50257
    assert training_memory(model, 24, "bfloat16")["activations"] == need["activations"] // 2


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_split_shorter_than_the_block_is_refused_at_start(tmp_path, helpers, split):
    corpus = tmp_path / "c.txt"
    corpus.write_text("abcdefgh" * 40)  # 320 characters: 288 train, 32 val
    prepare([corpus], tmp_path / "d", tokenizer="char", val_fraction=0.1)
    block = 40 if split == "val" else 300
    config = helpers.tiny_config(tmp_path, tmp_path / "d", block_size=block, steps=2, eval_every=100)
    with pytest.raises(
        ValueError, match=f"block_size: {block} needs more than {block + 1} tokens, but {split}.bin"
    ):
        train(config)
    assert not (_dir(config) / "log.jsonl").exists()


def test_the_app_keeps_to_the_flag_vocabulary_and_has_no_import_cycle():
    from app_common.testing import assert_app_contract
    from gpt_uptrain.cli import build_parser

    assert_app_contract(build_parser(), "gpt_uptrain")


def test_the_calibration_batch_is_ralimps_4096_rows_and_last_k_is_checked_against_the_depth():
    from gpt_uptrain.train import CALIBRATION_TOKENS

    assert CALIBRATION_TOKENS == 4096
    with pytest.raises(ValueError, match=r"last_k: expected an integer in \[1, 2\], got 3"):
        GPTConfig(n_layer=2, n_head=2, n_embd=8, vocab_size=11, block_size=8, layer="ralimp", last_k=3)
