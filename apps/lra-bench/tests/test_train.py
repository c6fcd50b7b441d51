import dataclasses
import json

import numpy as np
import pytest
import torch

import app_common as ac
import lra_data
from lra_bench import TABLE_6, LRAClassifier, StepBatches, TrainConfig, run_name, train
from lra_bench.cli import main


@pytest.mark.parametrize("task", lra_data.TASKS)
def test_tiny_run_of_every_task_writes_a_result_a_checkpoint_and_a_log(tmp_path, data, task, helpers):
    config = helpers.tiny_config(tmp_path, task, attention="performer")
    record = train(config)
    assert record == ac.read_jsonl(config.results)[-1]
    assert record["task"] == task
    assert record["steps"] == 6
    assert record["stopped"] == "max_steps"
    assert 0.0 <= record["test_accuracy"] <= 1.0
    assert record["val_split"] == ("test" if task == "text" else "val")
    assert record["peak_memory_bytes"] > 0
    assert record["memory_kind"] == "cpu_peak_rss"
    assert record["config"]["batch_size"] == 8
    assert record["train_time_s"] > 0
    run_dir = config.runs / run_name(config)
    state = ac.load_checkpoint(run_dir / "checkpoint.pt")
    assert state["state"]["finished"]
    assert state["state"]["step"] == 6
    log = ac.read_jsonl(run_dir / "log.jsonl")
    assert [r["step"] for r in log if "train_loss" in r] == list(range(1, 7))
    assert all(np.isfinite(r["train_loss"]) for r in log if "train_loss" in r)
    # A finished run resumed again does nothing and appends nothing.
    assert train(dataclasses.replace(config, resume=True)) is None
    assert len(ac.read_jsonl(config.results)) == 1


class Killed(Exception):
    pass


def _kill_at(step):
    def hook(at):
        if at == step:
            raise Killed

    return hook


def test_resumed_run_ends_with_the_same_weights_and_result_as_an_unbroken_one(tmp_path, data, helpers):
    # Dropout on: the random state in the checkpoint matters.
    settings = {
        "attention": "performer",
        "max_steps": 10,
        "eval_frequency": 4,
        "dropout": 0.1,
        "attention_dropout": 0.1,
    }
    whole = helpers.tiny_config(tmp_path / "whole", data=data, **settings)
    broken = helpers.tiny_config(tmp_path / "broken", data=data, **settings)
    assert run_name(whole) == run_name(broken)
    expected = train(whole)
    with pytest.raises(Killed):
        train(broken, on_checkpoint=_kill_at(4))
    assert not broken.results.exists()
    got = train(dataclasses.replace(broken, resume=True))
    for key in ("test_accuracy", "val_accuracy", "best_step", "steps", "stopped"):
        assert got[key] == expected[key], key
    a = ac.load_checkpoint(whole.runs / run_name(whole) / "checkpoint.pt")
    b = ac.load_checkpoint(broken.runs / run_name(broken) / "checkpoint.pt")
    for key in ("model", "best_model"):
        for name, tensor in a[key].items():
            if isinstance(tensor, torch.Tensor):
                assert torch.equal(tensor, b[key][name]), name
    loss = [ac.read_jsonl(c.runs / run_name(c) / "log.jsonl") for c in (whole, broken)]
    assert loss[0] == loss[1]  # the lines the killed run wrote after its checkpoint were rewound


def test_loop_learns_an_easy_generated_task(tmp_path, helpers):
    sizes = {"train": 512, "val": 64, "test": 128}
    helpers.write_cache(tmp_path / "data", "listops", sizes=sizes, examples=helpers.majority_digit_examples)
    config = helpers.tiny_config(
        tmp_path,
        attention="oprf-fastfoodl",
        batch_size=32,
        learning_rate=3e-3,
        warmup_steps=10,
        max_steps=150,
        eval_frequency=50,
        eval_steps=0,
        patience=10,
        dropout=0.0,
        attention_dropout=0.0,
        log_every=50,
    )
    record = train(config)
    assert record["test_accuracy"] >= 0.9  # chance is 0.1


def test_early_stopping_waits_for_init_steps_then_stops_after_patience_evaluations(tmp_path, data, helpers):
    # A learning rate so small that validation accuracy never improves after the first evaluation.
    config = helpers.tiny_config(
        tmp_path, learning_rate=1e-9, max_steps=60, eval_frequency=2, patience=2, init_steps=10
    )
    record = train(config)
    assert record["stopped"] == "early_stopping"
    assert record["best_step"] == 2
    assert record["steps"] == 10  # patience ran out at step 6, but not before init_steps


def test_table6_fills_the_per_task_fields_and_overrides_win():
    config = TrainConfig(task="retrieval").resolved()
    assert (config.batch_size, config.learning_rate, config.warmup_steps) == (16, 2e-4, 800)
    assert (config.eval_frequency, config.eval_steps, config.init_steps, config.max_length) == (
        1000,
        300,
        3000,
        4000,
    )
    assert (config.dim, config.hidden_dim, config.num_heads, config.num_layers, config.patience) == (
        64,
        128,
        2,
        2,
        10,
    )
    assert TrainConfig(task="image", batch_size=4).resolved().batch_size == 4
    assert TrainConfig(task="image").resolved({"image": {"eval_steps": 7}}).eval_steps == 7
    assert set(TABLE_6) == set(lra_data.TASKS)
    with pytest.raises(ValueError, match=r"table6.image: unknown bacth_size"):
        TrainConfig(task="image").resolved({"image": {"bacth_size": 7}})
    with pytest.raises(ValueError, match="task: unknown 'listop'"):
        TrainConfig(task="listop")
    with pytest.raises(ValueError, match="num_heads: expected a divisor of dim=64"):
        TrainConfig(task="image", num_heads=3)


def test_run_name_ignores_paths_and_device_but_not_hyperparameters(tmp_path):
    a = TrainConfig(task="listops", data=tmp_path, device="cpu")
    assert run_name(a) == run_name(TrainConfig(task="listops"))
    assert run_name(a) == run_name(TrainConfig(task="listops", batch_size=32))  # Table 6's value
    assert run_name(a) != run_name(TrainConfig(task="listops", batch_size=16))
    assert run_name(a).startswith("listops-softmax-f128-s0-")


def test_batches_depend_only_on_seed_and_step_and_split_evenly_over_processes():
    whole = StepBatches(20, 4, seed=3)
    first = [b for _, b in zip(range(12), whole, strict=False)]
    later = StepBatches(20, 4, seed=3, start_step=7)
    assert [b for _, b in zip(range(5), later, strict=False)] == first[7:12]
    assert sorted(i for batch in first[:5] for i in batch) == list(range(20))  # an epoch is a permutation
    halves = [StepBatches(20, 4, seed=3, rank=r, world_size=2) for r in range(2)]
    shares = [[b for _, b in zip(range(6), h, strict=False)] for h in halves]
    assert [s0 + s1 for s0, s1 in zip(*shares, strict=True)] == first[:6]
    with pytest.raises(ValueError, match="batch_size: 30 is larger"):
        StepBatches(20, 30, seed=0)
    with pytest.raises(ValueError, match="not divisible"):
        StepBatches(20, 5, seed=0, world_size=2)


def test_retrieval_model_classifies_pairs_and_mean_pools_only_real_tokens():
    config = TrainConfig(task="retrieval", dim=32, embedding_dim=32, hidden_dim=32, dropout=0.0).resolved()
    model = LRAClassifier(config, vocab_size=257, num_classes=2, pair=True).eval()
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
        f'data = "{data}"\nresults = "{tmp_path / "r.jsonl"}"\nruns = "{tmp_path / "runs"}"\n'
        'device = "cpu"\nbatch_size = 4\nmax_steps = 3\ndim = 32\nembedding_dim = 32\n'
        "[table6.listops]\neval_frequency = 3\neval_steps = 1\nwarmup_steps = 1\nmax_length = 32\n"
        "batch_size = 2\n"
    )
    assert main(["train", "--config", str(toml), "--task", "listops", "--max-steps", "2"]) == 0
    config = ac.read_jsonl(tmp_path / "r.jsonl")[0]["config"]
    assert (config["batch_size"], config["max_steps"], config["eval_frequency"], config["dim"]) == (
        4,
        2,
        3,
        32,
    )
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--task", "listops", "--data", str(tmp_path / "none"), "--device", "cpu"])
    assert exit_info.value.code == 2


@pytest.mark.parametrize("command", ["train", "sweep", "report", "quickstart", "attentions"])
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: lra-bench" in capsys.readouterr().out


def test_attentions_subcommand_lists_rf_attention_names(capsys):
    main(["attentions", "oprf-*"])
    names = capsys.readouterr().out.split()
    assert "oprf-fastfoodl" in names
    assert all(n.startswith("oprf-") for n in names)


def test_bfloat16_autocast_run_trains(tmp_path, data, helpers):
    record = train(helpers.tiny_config(tmp_path, attention="oprf-orf", dtype="bfloat16", max_steps=3))
    assert record["config"]["dtype"] == "bfloat16"
    assert record["steps"] == 3
    assert json.dumps(record)  # the record is plain JSON
