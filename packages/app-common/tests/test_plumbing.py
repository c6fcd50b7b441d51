"""The shared plumbing: batch order, the one resume policy, field groups, timers, tables, child processes."""

import argparse
import csv
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from app_common.batches import StepBatches, stream_seed
from app_common.checkpoint import Checkpointer, load_checkpoint, load_state_dicts, rewind_log, state_dicts
from app_common.config import (
    add_config_argument,
    add_dataclass_arguments,
    config_dict,
    config_from,
    split_toml,
)
from app_common.device import device_name
from app_common.distributed import evaluation_sums
from app_common.fields import (
    EvalFields,
    Fields,
    LayerFields,
    OptimizerFields,
    OutputFields,
    RaLiMPFields,
    RuntimeFields,
    check_int_fields,
    identity_digest,
    may_change_on_resume,
    option,
    run_identity,
    run_name,
)
from app_common.measure import count_parameters, interleaved_medians, median_seconds
from app_common.process import run_child
from app_common.records import report_folder
from app_common.results import append_jsonl, mean_and_std, read_jsonl, write_csv, write_table
from app_common.testing import Killed, kill_at
from app_common.vocabulary import FLAGS


def test_step_batches_depend_only_on_seed_and_step_and_split_over_processes():
    whole = StepBatches(20, 4, seed=3)
    first = [b for _, b in zip(range(12), whole, strict=False)]
    later = StepBatches(20, 4, seed=3, start_step=7)
    assert [b for _, b in zip(range(5), later, strict=False)] == first[7:12]
    epoch = sorted(i for b in first[:5] for i in b)
    assert epoch == list(range(20))  # one epoch is a permutation
    assert first[:5] != first[5:10]  # a fresh one per epoch
    halves = [StepBatches(20, 4, seed=3, rank=r, world_size=2) for r in range(2)]
    joined = next(iter(halves[0])) + next(iter(halves[1]))
    assert joined == first[0]
    assert stream_seed(3, 5) == 1_000_003 * 3 + 5
    with pytest.raises(ValueError, match="batch_size: 30 is larger than the training split"):
        StepBatches(20, 30, seed=0)
    with pytest.raises(ValueError, match="not divisible by the 2 processes"):
        StepBatches(20, 5, seed=0, world_size=2)


@dataclass(frozen=True, kw_only=True)
class Model(Fields):
    dim: int = 8


@dataclass(frozen=True, kw_only=True)
class Run(RuntimeFields, OptimizerFields, EvalFields, OutputFields):
    MAY_CHANGE_ON_RESUME: ClassVar[tuple[str, ...]] = ("workers",)

    lr: float = option("lr", 1e-2)
    model: Model = field(default_factory=Model)
    workers: int = 0


def test_a_run_identity_is_its_settings_minus_those_that_may_change_on_resume():
    identity = run_identity(Run(device="cpu", threads=2, workers=3, log_every=7, out=Path("x")))
    assert set(identity) == {"steps", "lr", "grad_clip", "dtype", "eval_every", "dim"}
    assert may_change_on_resume(Run) >= {"device", "threads", "out", "resume", "log_every", "workers"}


def test_a_run_name_is_its_label_and_a_digest_that_ignores_settings_that_may_change_on_resume():
    name = run_name("toy-s0", run_identity(Run()))
    assert re.fullmatch(r"toy-s0-[0-9a-f]{8}", name)
    assert run_name("toy-s0", run_identity(Run(device="cpu", workers=3, out=Path("x")))) == name


def test_the_identity_digest_changes_with_an_identity_setting():
    assert identity_digest(run_identity(Run(model=Model(dim=4)))) != identity_digest(run_identity(Run()))
    assert identity_digest({"a": 1, "b": 2}) == identity_digest({"b": 2, "a": 1})  # key order is not identity


def test_a_setting_added_later_stays_out_of_the_identity_at_the_value_earlier_runs_had():
    @dataclass(frozen=True, kw_only=True)
    class Later(Run):
        ADDED_SETTINGS: ClassVar[dict[str, Any]] = {"width": 16}

        width: int = 16

    assert run_identity(Later()) == run_identity(Run())
    assert run_identity(Later(width=32)) == {**run_identity(Run()), "width": 32}


def test_a_run_label_that_cannot_name_a_folder_is_refused():
    for label in ("", "a/b"):
        with pytest.raises(ValueError, match="label: expected a non-empty run label"):
            run_name(label, {})


def test_write_csv_writes_the_header_then_the_cells(tmp_path):
    import csv

    path = write_csv(tmp_path / "t.csv", ["a", "b"], [(1, 0.125), ("x,y", None)])
    with path.open(newline="", encoding="utf-8") as f:
        assert list(csv.reader(f)) == [["a", "b"], ["1", "0.125"], ["x,y", ""]]


def test_checkpointer_resumes_the_same_identity_and_refuses_another_listing_the_changed_keys(tmp_path):
    path = tmp_path / "checkpoint.pt"
    identity = run_identity(Run())
    Checkpointer(path, identity).save(5, {"weights": torch.arange(3)})
    state = Checkpointer(path, run_identity(Run(device="cpu", log_every=1))).load()
    assert state["step"] == 5
    assert torch.equal(state["weights"], torch.arange(3))
    changed = run_identity(Run(lr=0.5, model=Model(dim=4)))
    with pytest.raises(ValueError, match=r"other settings \(dim: 8 -> 4; lr: 0\.01 -> 0\.5\).*--no-resume"):
        Checkpointer(path, changed).load()
    assert Checkpointer(path, changed, resume=False).load() is None  # --no-resume: start over
    assert Checkpointer(tmp_path / "none.pt", identity).load() is None


def test_kill_at_raises_after_the_checkpoint_is_on_disk(tmp_path):
    path = tmp_path / "c.pt"
    checkpointer = Checkpointer(path, {"a": 1}, on_save=kill_at(4))
    checkpointer.save(2, {})
    with pytest.raises(Killed):
        checkpointer.save(4, {})
    assert load_checkpoint(path)["step"] == 4
    checkpointer.remove()
    assert not path.exists()


def test_state_dicts_round_trip_and_missing_parts_are_named():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    saved = state_dicts(model=model, optimizer=optimizer)
    other = torch.nn.Linear(3, 2)
    load_state_dicts(saved, model=other)
    assert torch.equal(other.weight, model.weight)
    with pytest.raises(ValueError, match="checkpoint: holds no scheduler"):
        load_state_dicts(saved, scheduler=optimizer)


def test_rewind_log_drops_lines_written_after_the_checkpoint(tmp_path):
    log = tmp_path / "log.jsonl"
    for step in (1, 2, 3, 4):
        append_jsonl(log, {"step": step})
    rewind_log(log, 2)
    assert read_jsonl(log) == [{"step": 1}, {"step": 2}]
    rewind_log(tmp_path / "missing.jsonl", 2)  # nothing to rewind


def test_nested_groups_take_flat_flags_and_flat_or_tabled_toml():
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, Run)
    config = config_from(Run, parser.parse_args(["--dim", "16"]), toml={"model": {"dim": 4}, "steps": 3})
    assert config.model.dim == 16  # flags win
    assert config.steps == 3
    assert config_from(Run, toml={"dim": 5}).model.dim == 5
    assert config_from(Run).model == Model()
    assert config_dict(config)["model"] == {"dim": 16}
    with pytest.raises(ValueError, match=r"TOML key model\.width: not a setting"):
        config_from(Run, toml={"model": {"width": 4}})
    help_text = parser.format_help()
    assert "{float32,bfloat16}" in help_text  # choices listed
    assert "clip the gradient norm" in help_text


def test_split_toml_gives_each_class_its_keys_and_refuses_unknown_ones():
    @dataclass(frozen=True)
    class Grid:
        seed: tuple[int, ...] = (0,)

    grid, run = split_toml({"seed": [1, 2], "lr": 0.1, "table6": {}}, Grid, Run, extra=("table6",))
    assert grid == {"seed": [1, 2]}
    assert run == {"lr": 0.1}
    with pytest.raises(ValueError, match=r"sweep\.toml: unknown keys lrr; expected some of"):
        split_toml({"lrr": 1}, Grid, Run, source="sweep.toml")


def test_vocabulary_flags_name_themselves_in_errors():
    with pytest.raises(ValueError, match="--threads: expected an integer >= 0, got -3"):
        Run(threads=-3)
    with pytest.raises(ValueError, match="--grad-clip: expected a number >= 0"):
        Run(grad_clip=-1.0)
    with pytest.raises(ValueError, match="--device: expected auto, cpu, cuda"):
        Run(device="tpu")
    with pytest.raises(ValueError, match="--features: expected an integer >= 1, got 0"):
        LayerFields(features=0)
    with pytest.raises(KeyError, match="not in the flag vocabulary"):
        option("learning_rate")
    with pytest.raises(ValueError, match="--num-atoms: expected an integer >= 0, got -1"):
        RaLiMPFields(num_atoms=-1)


def test_ralimp_fields_default_to_ralimps_fit_and_reach_only_a_ralimp_layer():
    fields = RaLiMPFields()
    assert (fields.fit, fields.num_atoms) == ("variance", 1)
    assert RaLiMPFields(fit="paper").ralimp_options("ralimp") == {"fit": "paper", "num_atoms": 1}
    assert RaLiMPFields(fit="paper").ralimp_options("eugen") == {}


def test_check_int_fields_names_the_flag_checks_each_grid_value_and_refuses_floats_and_bools():
    @dataclass(frozen=True)
    class Grid:
        batch_size: int = 8
        seed: tuple = (0, 1)
        workers: object = 0

    check_int_fields(Grid(), "batch_size", "seed", minimum=0)
    with pytest.raises(ValueError, match=r"--seed: expected an integer >= 0, got -1"):
        check_int_fields(Grid(seed=(0, -1)), "seed", minimum=0)
    with pytest.raises(ValueError, match=r"--batch-size: expected an integer >= 1, got 2.5"):
        check_int_fields(Grid(batch_size=2.5), "batch_size")
    with pytest.raises(ValueError, match=r"--workers: expected an integer >= 0, got True"):
        check_int_fields(Grid(workers=True), "workers", minimum=0)


def test_shared_flags_say_one_thing_in_every_parser():
    parser = argparse.ArgumentParser()
    add_config_argument(parser, "[extra] tables override the defaults")
    config = next(a for a in parser._actions if "--config" in a.option_strings)
    assert config.help == f"{FLAGS['config']}; [extra] tables override the defaults"

    @dataclass(frozen=True)
    class Report:
        results: Path
        report_dir: Path | None = option("report_dir", None)

    add_dataclass_arguments(parser, Report)
    report = next(a for a in parser._actions if "--report-dir" in a.option_strings)
    assert report.help.startswith(FLAGS["report_dir"])
    assert report_folder("out/results.jsonl") == Path("out/report")
    assert report_folder("out/results.jsonl", "elsewhere") == Path("elsewhere")


def test_interleaved_medians_time_each_function_once_per_round(monkeypatch):
    clock = iter(range(1000))
    monkeypatch.setattr("app_common.measure.time.perf_counter", lambda: float(next(clock)))
    calls = []
    medians = interleaved_medians(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3, warmup=1
    )
    assert calls == ["a", "b"] * 4
    assert medians == {"a": 1.0, "b": 1.0}  # each call spans one tick of the fake clock
    assert median_seconds(lambda: None, repeats=1, warmup=0) == 1.0
    with pytest.raises(ValueError, match="repeats: expected an integer >= 1"):
        median_seconds(lambda: None, repeats=0)


def test_count_parameters_counts_trainable_parameters_and_never_buffers():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    model[1].weight.requires_grad_(False)
    assert count_parameters(model) == 3 * 2 + 2 + 2
    assert count_parameters(model, trainable=False) == 3 * 2 + 2 + 2 + 2


def test_write_table_writes_markdown_and_csv(tmp_path):
    text = write_table(tmp_path / "t" / "table", ["a", "b"], [["x", 1.5], ["y", 2]])
    assert text.splitlines()[0] == "| a | b   |"
    assert (tmp_path / "t" / "table.md").read_text() == text + "\n"
    with (tmp_path / "t" / "table.csv").open() as f:
        assert list(csv.reader(f)) == [["a", "b"], ["x", "1.5"], ["y", "2"]]


def test_device_name_of_the_cpu_is_its_model():
    assert device_name(torch.device("cpu")).strip()


def test_run_child_returns_the_exit_code():
    assert run_child(sys.exit, 3) == 3


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().split(") ")[-1].startswith("Z"))


def test_sigterm_to_the_parent_reaches_the_child_and_waits_for_it(tmp_path):
    (tmp_path / "child_target.py").write_text(
        textwrap.dedent(
            """
            import os, sys, time
            def sleep_forever(path):
                open(path, "w").write(str(os.getpid()))
                time.sleep(120)
            """
        )
    )
    pid_file = tmp_path / "child.pid"
    script = (
        "import child_target, sys\nfrom app_common.process import run_child\n"
        f"run_child(child_target.sleep_forever, {str(pid_file)!r})\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    parent = subprocess.Popen([sys.executable, "-c", script], env=env)
    deadline = time.monotonic() + 60
    while not (pid_file.is_file() and pid_file.read_text()):
        assert time.monotonic() < deadline, "the child never started"
        assert parent.poll() is None, "the parent exited early"
        time.sleep(0.05)
    child = int(pid_file.read_text())
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=30) == 128 + signal.SIGTERM
    assert not _alive(child)


def test_mean_and_std_over_seeds_is_the_mean_and_the_n_minus_1_spread():
    # (1 + 2 + 6) / 3 = 3; squared deviations 4 + 1 + 9 = 14, over n - 1 = 2: variance 7.
    assert mean_and_std([1.0, 2.0, 6.0]) == pytest.approx((3.0, 7.0**0.5), rel=1e-15)


def test_mean_and_std_of_one_seed_has_no_spread():
    assert mean_and_std([0.25]) == (0.25, 0.0)


def test_evaluation_sums_add_each_batch_in_eval_mode_and_restore_training_mode():
    model = torch.nn.Dropout(0.5)
    seen = []

    def sums(batch, forward):
        seen.append(model.training)
        return torch.stack([forward(batch).sum(), torch.tensor(float(batch.numel()))])

    batches = [torch.ones(3), torch.full((2,), 4.0)]
    totals = evaluation_sums(model, batches, sums, size=2, device=torch.device("cpu"), dtype="float32")
    assert (totals.tolist(), seen, model.training) == ([11.0, 5.0], [False, False], True)
