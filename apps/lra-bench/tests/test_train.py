import dataclasses
import json

import numpy as np
import pytest
import torch

import lra_data
from app_common.checkpoint import load_checkpoint, save_checkpoint
from app_common.records import CORE_KEYS, finished_record
from app_common.results import read_jsonl
from app_common.testing import Killed, assert_resume_equals_unbroken, kill_at
from lra_bench import TABLE_6, LRAClassifier, run_name, train, train_config
from lra_bench.cli import main
from lra_bench.train import evaluate_so_far


@pytest.mark.parametrize("task", lra_data.TASKS)
def test_tiny_run_of_every_task_writes_a_result_a_checkpoint_and_a_log(tmp_path, data, task, helpers):
    config = helpers.tiny_config(tmp_path, task, attention="performer")
    record = train(config)
    assert record == read_jsonl(helpers.results(config))[-1]
    assert set(CORE_KEYS) <= set(record)
    assert record["details"]["task"] == task
    assert record["steps"] == 6
    assert record["stopped"] == "max_steps"
    assert 0.0 <= record["metrics"]["test_accuracy"] <= 1.0
    assert record["details"]["val_split"] == ("test" if task == "text" else "val")
    assert record["peak_memory_bytes"] > 0
    assert record["memory_kind"] == "cpu_peak_rss"
    assert record["config"]["batch_size"] == 8
    assert record["train_seconds"] > 0
    run_dir = helpers.run_dir(config)
    state = load_checkpoint(run_dir / "checkpoint.pt")
    assert state["step"] == 6
    assert finished_record(config.out, record["name"]) == record
    log = read_jsonl(run_dir / "log.jsonl")
    assert [r["step"] for r in log if "train_loss" in r] == list(range(1, 7))
    assert all(np.isfinite(r["train_loss"]) for r in log if "train_loss" in r)
    # A finished run resumed again does nothing and appends nothing.
    assert train(dataclasses.replace(config, resume=True)) is None
    assert len(read_jsonl(helpers.results(config))) == 1


@pytest.mark.parametrize("kill_step", [4, 10])
def test_resumed_run_ends_bit_identical_to_an_unbroken_one(tmp_path, data, helpers, kill_step):
    # Dropout on: the random state in the checkpoint matters; killed after an evaluation, and after the
    # last step before the test.
    settings = {
        "attention": "performer",
        "steps": 10,
        "eval_every": 4,
        "log_every": 3,
        "dropout": 0.1,
        "attention_dropout": 0.1,
    }

    def run(out, on_save):
        config = dataclasses.replace(helpers.tiny_config(out, data=data, **settings), out=out)
        return train(config, on_checkpoint=on_save)

    assert_resume_equals_unbroken(run, tmp_path, kill_step=kill_step)


def test_loop_learns_an_easy_generated_task(tmp_path, helpers):
    sizes = {"train": 512, "val": 64, "test": 128}
    helpers.write_cache(tmp_path / "data", "listops", sizes=sizes, examples=helpers.majority_digit_examples)
    config = helpers.tiny_config(
        tmp_path,
        attention="oprf-fastfoodl",
        batch_size=32,
        lr=3e-3,
        warmup_steps=10,
        steps=150,
        eval_every=50,
        eval_batches=0,
        patience=10,
        dropout=0.0,
        attention_dropout=0.0,
        log_every=50,
    )
    record = train(config)
    assert record["metrics"]["test_accuracy"] >= 0.9  # chance is 0.1


def test_early_stopping_waits_for_init_steps_then_stops_after_patience_evaluations(tmp_path, data, helpers):
    # A learning rate so small that validation accuracy never improves after the first evaluation.
    config = helpers.tiny_config(tmp_path, lr=1e-9, steps=60, eval_every=2, patience=2, init_steps=10)
    record = train(config)
    assert record["stopped"] == "early_stopping"
    assert record["details"]["best_step"] == 2
    assert record["steps"] == 10  # patience ran out at step 6, but not before init_steps


def test_table6_fills_the_per_task_fields_once_and_overrides_win():
    config = train_config({"task": "retrieval"})
    assert (config.batch_size, config.lr, config.warmup_steps) == (16, 2e-4, 800)
    assert (config.eval_every, config.eval_batches, config.init_steps, config.max_length) == (
        1000,
        300,
        3000,
        4000,
    )
    model = config.model
    assert (model.dim, model.hidden_dim, model.num_heads, model.num_layers, config.patience) == (
        64,
        128,
        2,
        2,
        10,
    )
    assert train_config({"task": "image", "batch_size": 4}).batch_size == 4
    assert train_config({"task": "image"}, {"image": {"eval_batches": 7}}).eval_batches == 7
    given = train_config({"task": "image", "eval_batches": 3}, {"image": {"eval_batches": 7}})
    assert given.eval_batches == 3
    assert set(TABLE_6) == set(lra_data.TASKS)
    with pytest.raises(ValueError, match=r"table6.image: unknown bacth_size"):
        train_config({"task": "image"}, {"image": {"bacth_size": 7}})
    with pytest.raises(ValueError, match="--task: unknown 'listop'"):
        train_config({"task": "listop"})
    with pytest.raises(ValueError, match="--num-heads: expected a divisor of dim=64"):
        train_config({"task": "image", "num_heads": 3})
    with pytest.raises(ValueError, match="--grad-clip: expected a number >= 0"):
        train_config({"task": "image", "grad_clip": -1.0})


def test_run_name_ignores_paths_and_device_but_not_hyperparameters(tmp_path):
    a = train_config({"task": "listops", "data": tmp_path, "device": "cpu", "out": tmp_path})
    assert run_name(a) == run_name(train_config({"task": "listops"}))
    assert run_name(a) == run_name(train_config({"task": "listops", "batch_size": 32}))  # Table 6's value
    assert run_name(a) != run_name(train_config({"task": "listops", "batch_size": 16}))
    assert run_name(a) != run_name(train_config({"task": "listops", "lr": 3e-4}))
    assert run_name(a).startswith("listops-softmax-f128-s0-")


def test_resuming_a_checkpoint_of_other_identity_settings_is_refused(tmp_path, data, helpers):
    config = helpers.tiny_config(tmp_path, steps=3, eval_every=3)
    with pytest.raises(Killed):
        train(config, on_checkpoint=kill_at(3))
    checkpoint = helpers.run_dir(config) / "checkpoint.pt"
    state = load_checkpoint(checkpoint)
    state["identity"]["lr"] = 0.5  # as if the folder held a run under another learning rate
    save_checkpoint(checkpoint, state)
    with pytest.raises(ValueError, match=r"other settings \(lr: 0\.5 -> 0\.001\).*--no-resume"):
        train(config)
    assert train(dataclasses.replace(config, resume=False))["steps"] == 3  # --no-resume starts over


def test_retrieval_model_classifies_pairs_and_mean_pools_only_real_tokens():
    config = train_config(
        {"task": "retrieval", "dim": 32, "embedding_dim": 32, "hidden_dim": 32, "dropout": 0.0}
    )
    model = LRAClassifier(
        config.model, vocab_size=257, num_classes=2, pair=True, max_length=config.max_length, seed=0
    ).eval()
    tokens = torch.randint(1, 257, (2, 10))
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[:, 6:] = True
    padded = tokens.clone()
    padded[:, 6:] = 0
    assert model(tokens, mask, tokens, mask).shape == (2, 2)
    # Whatever the padded positions hold, the pooled vector is the same.
    torch.testing.assert_close(model.encoder(tokens, mask), model.encoder(padded, mask))
    with pytest.raises(ValueError, match="tokens_1"):
        model(tokens, mask)


def test_cli_train_reads_toml_then_flags(tmp_path, data):
    toml = tmp_path / "run.toml"
    toml.write_text(
        f'data = "{data}"\nout = "{tmp_path / "out"}"\n'
        'device = "cpu"\nbatch_size = 4\nsteps = 3\ndim = 32\nembedding_dim = 32\n'
        "[table6.listops]\neval_every = 3\neval_batches = 1\nwarmup_steps = 1\nmax_length = 32\n"
        "batch_size = 2\n"
    )
    assert main(["train", "--config", str(toml), "--task", "listops", "--steps", "2"]) == 0
    config = read_jsonl(tmp_path / "out" / "results.jsonl")[0]["config"]
    assert (config["batch_size"], config["steps"], config["eval_every"], config["model"]["dim"]) == (
        4,
        2,
        3,
        32,
    )
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--task", "listops", "--data", str(tmp_path / "none"), "--device", "cpu"])
    assert exit_info.value.code == 2
    toml.write_text("stpes = 3\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--config", str(toml), "--task", "listops"])
    assert exit_info.value.code == 2


def test_a_required_flag_is_satisfied_by_the_toml_file(tmp_path, data, capsys):
    toml = tmp_path / "run.toml"
    toml.write_text(
        f'task = "listops"\ndata = "{data}"\nout = "{tmp_path / "out"}"\ndevice = "cpu"\nsteps = 2\n'
        "dim = 32\nembedding_dim = 32\n[table6.listops]\neval_every = 2\neval_batches = 1\nwarmup_steps = 1\n"
        "max_length = 32\nbatch_size = 2\n"
    )
    assert main(["train", "--config", str(toml)]) == 0
    (record,) = read_jsonl(tmp_path / "out" / "results.jsonl")
    assert record["details"]["task"] == "listops"
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--steps", "2"])
    assert exit_info.value.code == 2
    assert "--task: required" in capsys.readouterr().err


def test_threads_and_features_errors_name_the_flag(tmp_path, capsys):
    for argv, flag in (
        (["train", "--task", "listops", "--threads", "-3"], "--threads"),
        (["quick", "--attention-features", "-1", "--out", str(tmp_path / "q")], "--attention-features"),
        (["quickstart", "--attention", "performr", "--out", str(tmp_path / "q")], "performr"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        assert flag in capsys.readouterr().err
    assert not (tmp_path / "q").exists()  # refused before any data is generated


@pytest.mark.parametrize(
    "command", ["train", "evaluate", "sweep", "report", "curves", "quick", "quickstart", "list"]
)
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: lra-bench" in capsys.readouterr().out


def test_list_subcommand_lists_rf_attention_names(capsys):
    main(["list", "oprf-*"])
    names = capsys.readouterr().out.split()
    assert "oprf-fastfoodl" in names
    assert all(n.startswith("oprf-") for n in names)


def test_bfloat16_autocast_run_trains(tmp_path, data, helpers):
    record = train(helpers.tiny_config(tmp_path, attention="oprf-orf", dtype="bfloat16", steps=3))
    assert record["config"]["dtype"] == "bfloat16"
    assert record["steps"] == 3
    assert json.dumps(record)  # the record is plain JSON


@pytest.mark.parametrize(
    ("attention", "applies"), [("softmax", True), ("performer", False), ("nystromformer", False)]
)
def test_attention_dropout_goes_only_to_attentions_that_state_support_for_it(attention, applies):
    from lra_bench.config import ModelConfig
    from lra_bench.model import create_attention

    module, applied = create_attention(ModelConfig(attention=attention, attention_dropout=0.2), seed=0)
    assert module.supports_attention_dropout is applies
    assert applied is applies
    if applies:
        assert module.attention_dropout == 0.2


def test_the_app_keeps_to_the_flag_vocabulary_and_has_no_import_cycle():
    from app_common.testing import assert_app_contract
    from lra_bench.cli import build_parser

    assert_app_contract(build_parser(), "lra_bench")


def test_evaluate_tests_the_best_weights_so_far_of_a_killed_run(tmp_path, data, helpers):
    config = helpers.tiny_config(tmp_path, attention="performer", steps=12, eval_every=4)
    with pytest.raises(Killed):
        train(config, on_checkpoint=kill_at(8))
    record = evaluate_so_far(config)
    log = read_jsonl(helpers.run_dir(config) / "log.jsonl")
    curve = [[r["step"], r["val_accuracy"]] for r in log if "val_accuracy" in r]
    assert record["curve"] == curve
    assert [step for step, _ in curve] == [4, 8]
    assert record["step"] == 8
    assert record["val_accuracy"] == max(accuracy for _, accuracy in curve)
    assert record["best_step"] == next(step for step, accuracy in curve if accuracy == record["val_accuracy"])
    # The test accuracy of the best weights, counted by a plain loop over the test split.
    state = load_checkpoint(helpers.run_dir(config) / "checkpoint.pt")
    test_set = lra_data.load(config.task, "test", config.data)
    model = LRAClassifier(
        config.model,
        vocab_size=test_set.vocab_size,
        num_classes=test_set.num_classes,
        pair=False,
        max_length=32,
        seed=0,
    )
    model.load_state_dict(state["state"]["best"]["weights"])
    model.eval()
    with torch.no_grad():
        correct = 0
        for tokens, label in test_set:
            *inputs, _ = lra_data.collate([(tokens, label)])
            correct += int(model(*inputs).argmax(-1).item() == label)
    assert record["test_accuracy"] == pytest.approx(correct / len(test_set))
    assert not (helpers.run_dir(config) / "record.json").exists()  # the run is left unfinished


def test_evaluate_command_appends_a_record_and_curves_plots_it(tmp_path, data, helpers, capsys):
    config = helpers.tiny_config(tmp_path, attention="performer", steps=12, eval_every=4)
    with pytest.raises(Killed):
        train(config, on_checkpoint=kill_at(4))
    settings = {"task": "listops", "attention": "performer", "steps": 12, "eval_every": 4}
    toml = tmp_path / "tiny.toml"
    toml.write_text("\n".join(f"{key} = {json.dumps(value)}" for key, value in settings.items()))
    tiny = ["dim", "embedding_dim", "hidden_dim", "batch_size", "max_length", "attention_features", "lr"]
    tiny += ["warmup_steps", "eval_batches", "init_steps", "log_every", "threads"]
    flags = ["--config", str(toml), "--data", str(config.data), "--out", str(config.out), "--device", "cpu"]
    flags += [f"--{name.replace('_', '-')}={helpers.TINY_SETTINGS[name]}" for name in tiny]
    assert main(["evaluate", *flags]) == 0, capsys.readouterr().err
    (record,) = read_jsonl(config.out / "partial.jsonl")
    assert record["attention"] == "performer"
    assert record["step"] == 4
    png = tmp_path / "report" / "curves.png"
    assert main(["curves", str(config.out / "partial.jsonl"), "--report-dir", str(tmp_path / "report")]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_evaluate_without_a_checkpoint_says_so(tmp_path, data, helpers):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        evaluate_so_far(helpers.tiny_config(tmp_path, attention="performer"))
