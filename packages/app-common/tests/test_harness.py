"""The training harness: resume equal to an unbroken run, NaN policy, phases, schedules, parameter groups."""

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from app_common.cli import app_parser
from app_common.config import add_dataclass_arguments
from app_common.fields import (
    EvalFields,
    OptimizerFields,
    OutputFields,
    RuntimeFields,
    option,
    run_identity,
    run_name,
)
from app_common.harness import TrainData, Trainer
from app_common.records import CORE_KEYS, finished_record, flat_record, run_dir, write_identity
from app_common.results import read_jsonl
from app_common.run import Run
from app_common.schedules import param_groups, schedule
from app_common.testing import assert_resume_equals_unbroken


def _toy_run(
    out, on_save, *, steps=12, on_nan="raise", poison_at=None, lbfgs_steps=0, accumulate=1, data=True
):
    """A tiny classifier with dropout, trained through the harness; returns its record."""
    run = Run(name="toy", out=out, identity={"steps": steps}, seed=3, device="cpu", on_save=on_save)
    if (record := run.finished()) is not None:
        return record
    model = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 3))
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 5, generator=generator), torch.randint(0, 3, (40,), generator=generator)
    adam = torch.optim.AdamW(param_groups(model, 0.1), lr=0.05)
    optimizers = {"adam": adam}
    phases = [("adam", steps)]
    if lbfgs_steps:
        optimizers["lbfgs"] = torch.optim.LBFGS(model.parameters(), max_iter=3)
        phases.append(("lbfgs", lbfgs_steps))
    noise = torch.Generator().manual_seed(1)
    trainer = Trainer(
        run,
        model,
        optimizers,
        steps=steps + lbfgs_steps,
        phases=phases,
        schedule=schedule("cosine", 3, steps),
        state={"noise": noise},
        grad_clip=0.5,
        log_every=2,
        eval_every=4,
        checkpoint_every=3,
        on_nan=on_nan,
        show_progress=False,
    )

    def loss_fn(step, batch):
        inputs, labels = batch if data else (x, y)
        inputs = inputs + 0.01 * torch.randn(inputs.shape, generator=noise)
        loss = F.cross_entropy(trainer.forward(inputs), labels)
        return loss * math.nan if step == poison_at else loss

    def evaluate(step):
        model.eval()
        with torch.no_grad():
            return {"val_loss": F.cross_entropy(model(x), y).item()}

    trainer.fit(
        loss_fn,
        data=TrainData(TensorDataset(x, y), 8) if data else None,
        accumulate=accumulate,
        evaluate=evaluate,
    )
    record = trainer.record({"steps": steps}, metrics=evaluate(trainer.step), details={"note": "toy"})
    return trainer.finish(record)


@pytest.mark.parametrize("kill_step", [3, 4, 12])
def test_a_killed_and_resumed_run_ends_bit_identical_to_an_unbroken_one(tmp_path, kill_step):
    assert_resume_equals_unbroken(_toy_run, tmp_path, kill_step=kill_step)


def test_resume_equality_holds_across_an_lbfgs_phase_and_without_a_data_set(tmp_path):
    def run(out, on_save):
        return _toy_run(out, on_save, steps=6, lbfgs_steps=3, data=False)

    assert_resume_equals_unbroken(run, tmp_path, kill_step=6)


def test_the_record_has_the_core_keys_and_the_layout_is_the_one_of_every_app(tmp_path):
    record = _toy_run(tmp_path, None)
    assert set(CORE_KEYS) <= set(record)
    assert record["steps"] == 12
    assert record["trainable_parameters"] == record["num_parameters"] == 5 * 16 + 16 + 16 * 3 + 3
    assert record["details"] == {"note": "toy"}
    assert finished_record(tmp_path, "toy")["metrics"] == record["metrics"]
    assert read_jsonl(tmp_path / "results.jsonl") == [record]
    log = read_jsonl(run_dir(tmp_path, "toy") / "log.jsonl")
    assert [r["step"] for r in log if "train_loss" in r] == [2, 4, 6, 8, 10, 12]
    assert [r["step"] for r in log if "val_loss" in r] == [4, 8, 12]
    assert flat_record(record)["val_loss"] == record["metrics"]["val_loss"]
    # a second call skips the finished run
    assert _toy_run(tmp_path, None) == record
    assert len(read_jsonl(tmp_path / "results.jsonl")) == 1


def test_nan_policy_stop_records_the_step_and_skips_the_update(tmp_path):
    record = _toy_run(tmp_path, None, on_nan="stop", poison_at=5)
    assert record["diverged_at"] == 5
    assert record["steps"] == 5
    with pytest.raises(RuntimeError, match=r"toy: the training loss became nan at step 6"):
        _toy_run(tmp_path / "raise", None, poison_at=5)


def test_a_checkpoint_of_another_world_size_or_identity_is_refused(tmp_path):
    _toy_run(tmp_path, None)
    path = run_dir(tmp_path, "toy") / "checkpoint.pt"
    (run_dir(tmp_path, "toy") / "record.json").unlink()
    state = torch.load(path, weights_only=True)
    torch.save({**state, "rng": state["rng"] * 2}, path)
    with pytest.raises(ValueError, match="saved by 2 processes; resume it with as many"):
        _toy_run(tmp_path, None)
    with pytest.raises(ValueError, match=r"steps: 12 -> 10"):
        _toy_run(tmp_path, None, steps=10)


def test_micro_batches_accumulate_to_the_mean_gradient(tmp_path):
    seen = []

    run = Run(name="acc", out=tmp_path, identity={}, seed=0, device="cpu")
    weight = torch.nn.Parameter(torch.zeros(()))
    model = torch.nn.Module()
    model.weight = weight
    sgd = torch.optim.SGD([weight], lr=1.0)
    trainer = Trainer(run, model, sgd, steps=1, show_progress=False)

    def loss_fn(step, micro):
        seen.append(micro)
        return weight * (micro + 1)

    trainer.fit(loss_fn, accumulate=4)
    assert seen == [0, 1, 2, 3]
    assert weight.item() == pytest.approx(-(1 + 2 + 3 + 4) / 4)


def test_schedules_warm_up_linearly_and_decay_to_final():
    cosine = schedule("cosine", 4, 10, final=0.1)
    assert [cosine(t) for t in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert cosine(4) == pytest.approx(1.0)
    assert cosine(10) == pytest.approx(0.1)
    assert cosine(50) == pytest.approx(0.1)
    linear = schedule("linear", 0, 10)
    assert linear(0) == 1.0
    assert linear(5) == pytest.approx(0.5)
    assert schedule("constant", 2, 10)(7) == 1.0
    with pytest.raises(ValueError, match="schedule"):
        schedule("cosin", 0, 10)


def test_param_groups_decay_matrices_only_and_never_ralimp_coefficients():
    model = torch.nn.Module()
    model.fc = torch.nn.Linear(3, 4)
    model.node_cos = torch.nn.Parameter(torch.zeros(2, 3))
    model.pos_embed = torch.nn.Parameter(torch.zeros(1, 5, 4))
    groups = param_groups(model, 0.1, lr=1e-3, lr_scales=[("fc.", 10.0)])
    by_id = {id(p): g for g in groups for p in g["params"]}
    assert by_id[id(model.fc.weight)]["weight_decay"] == 0.1
    assert by_id[id(model.fc.weight)]["lr"] == pytest.approx(1e-2)
    assert by_id[id(model.fc.bias)]["weight_decay"] == 0.0
    assert by_id[id(model.node_cos)]["weight_decay"] == 0.0
    assert by_id[id(model.pos_embed)]["weight_decay"] == 0.0
    with pytest.raises(ValueError, match="lr_scales"):
        param_groups(model, 0.1, lr_scales=[("fc.", 2.0)])


def test_the_vocabulary_contract_names_aliases_other_meanings_and_missing_subcommands():
    from dataclasses import dataclass

    from app_common.testing import assert_vocabulary, vocabulary_problems

    @dataclass(frozen=True, kw_only=True)
    class Good(RuntimeFields, OptimizerFields):
        warmup_steps: int = option("warmup_steps", 10, help="this app's default")

    parser, commands = app_parser("toy", "A toy app.")
    for name in ("train", "quick", "report", "list"):
        add_dataclass_arguments(commands.add_parser(name), Good)
    assert_vocabulary(parser)

    bad, commands = app_parser("bad", "A bad app.")
    train = commands.add_parser("train")
    train.add_argument("--warmup", type=float, help="fraction of the steps")
    train.add_argument("--lr", type=float, help="a learning rate of some kind")
    problems = vocabulary_problems(bad)
    assert "bad: no 'quick' subcommand" in problems
    assert "bad train: --warmup is spelled --warmup-steps in every app" in problems
    assert any(p.startswith("bad train: --lr means 'a learning rate of some kind'") for p in problems)
    with pytest.raises(AssertionError, match="flag vocabulary"):
        assert_vocabulary(bad)


@pytest.mark.parametrize("markup", ["``steps``", ":func:`run`", "[`Trainer`][app_common.harness.Trainer]"])
def test_the_vocabulary_contract_refuses_markup_in_help(markup):
    from app_common.testing import vocabulary_problems

    parser, commands = app_parser("toy", "A toy app.")
    commands.add_parser("train", description=f"Trains, see {markup}.")
    problems = vocabulary_problems(parser)
    assert any(p.startswith("toy train: --help shows markup") for p in problems)


def test_from_config_reads_the_shared_fields_and_lets_overrides_win(tmp_path):
    from dataclasses import dataclass

    @dataclass(frozen=True, kw_only=True)
    class Config(RuntimeFields, OptimizerFields, EvalFields, OutputFields):
        seed: int = 4
        steps: int = 7
        grad_clip: float = 0.5
        eval_every: int = 3
        log_every: int = 2
        checkpoint_every: int = 0  # 0: no checkpoints besides those after evaluations
        out: Path = tmp_path

    config = Config(device="cpu", dtype="bfloat16", resume=False)
    run = Run.from_config(config, label="cfg")
    assert (run.out, run.seed, run.dtype, run.resume, run.device) == (
        tmp_path,
        4,
        "bfloat16",
        False,
        torch.device("cpu"),
    )
    assert run.checkpointer.identity == run_identity(config)
    assert run.name == run_name("cfg", run_identity(config))
    assert run.dir == tmp_path / "runs" / run.name
    model = torch.nn.Linear(2, 1)
    trainer = Trainer.from_config(config, run, model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert (trainer.steps, trainer.grad_clip, trainer.eval_every, trainer.log_every) == (7, 0.5, 3, 2)
    assert trainer.checkpoint_every is None

    grid_point = Run.from_config(config, label="cfg-s9", seed=9, identity={"seed": 9})
    assert grid_point.seed == 9
    assert grid_point.checkpointer.identity == {"seed": 9}
    assert grid_point.name == run_name("cfg-s9", {"seed": 9})
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    assert Trainer.from_config(config, grid_point, model, sgd, steps=11).steps == 11


def test_from_config_without_eval_fields_keeps_the_trainer_defaults_and_names_a_missing_field(tmp_path):
    from dataclasses import dataclass

    @dataclass(frozen=True, kw_only=True)
    class Bare(RuntimeFields, OptimizerFields, OutputFields):
        seed: int = 0
        out: Path = tmp_path

    model = torch.nn.Linear(2, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer.from_config(Bare(), Run.from_config(Bare(), label="bare"), model, sgd)
    assert (trainer.eval_every, trainer.log_every, trainer.checkpoint_every) == (None, 10, None)

    @dataclass(frozen=True, kw_only=True)
    class NoSeed(RuntimeFields, OptimizerFields, OutputFields):
        out: Path = tmp_path

    with pytest.raises(AttributeError, match="NoSeed has no field seed"):
        Run.from_config(NoSeed(), label="no-seed")
    assert Run.from_config(NoSeed(), label="no-seed", seed=1).seed == 1
    with pytest.raises(ValueError, match=r"seed: expected an integer >= 0, got \(0, 1\)"):
        Run.from_config(Bare(), label="grid", seed=(0, 1))

    @dataclass(frozen=True, kw_only=True)
    class NoSteps(RuntimeFields, OutputFields):
        seed: int = 0
        out: Path = tmp_path

    with pytest.raises(AttributeError, match="NoSteps has no field steps, grad_clip"):
        Trainer.from_config(NoSteps(), Run.from_config(NoSteps(), label="no-steps"), model, sgd)


def test_a_run_of_other_settings_gets_its_own_folder_and_its_namesakes_say_what_differs(tmp_path):
    def toy(lr: float) -> Run:
        identity = {"lr": lr}
        return Run(name=run_name("toy", identity), identity=identity, out=tmp_path, seed=0, device="cpu")

    first = toy(0.1)
    first.checkpointer.save(3, {"weights": torch.zeros(2)})
    other = toy(0.2)
    assert other.dir != first.dir
    assert other.namesakes() == {first.name: ["lr: 0.1 -> 0.2"]}  # read from its checkpoint
    assert first.namesakes() == {}  # the other run has written nothing yet
    (tmp_path / "runs" / "toy-s1-00000000").mkdir()  # another label that starts the same
    (tmp_path / "runs" / "toy-1a2b3c4d").mkdir()  # the label's, without a checkpoint
    assert first.namesakes() == {"toy-1a2b3c4d": []}
    write_identity(tmp_path / "runs" / "toy-1a2b3c4d", {"lr": 0.3})  # started, no checkpoint yet
    assert first.namesakes() == {"toy-1a2b3c4d": ["lr: 0.3 -> 0.1"]}


def _two_optimizers():
    model = torch.nn.Linear(3, 2)
    return model, {
        "adam": torch.optim.Adam(model.parameters(), lr=0.1),
        "lbfgs": torch.optim.LBFGS(model.parameters(), max_iter=2),
    }


def test_a_trainer_is_complete_when_constructed_and_trains_straight_away(tmp_path):
    run = Run(name="ready", out=tmp_path, identity={}, seed=0, device="cpu")
    model, optimizers = _two_optimizers()
    noise = torch.Generator().manual_seed(1)
    trainer = Trainer(
        run,
        model,
        optimizers,
        steps=3,
        phases=[("adam", 2), ("lbfgs", 1)],
        schedule=schedule("constant", 0, 3),
        state={"noise": noise},
        extra={"note": 1},
        log_every=1,
        eval_every=1,
        checkpoint_every=1,
        show_progress=False,
    )
    unset = {"stopped", "diverged_at"}  # None until the run stops early or diverges
    assert [k for k, v in vars(trainer).items() if v is None and k not in unset] == []
    assert trainer.forward is trainer.eval_forward is model  # neither compiled nor under torchrun
    assert trainer.phases == [("adam", 2), ("lbfgs", 1)]
    x = torch.randn(8, 3, generator=noise)
    trainer.fit(lambda step, batch: trainer.forward(x).square().mean())
    assert (trainer.step, trainer.done) == (3, True)
    assert [r["step"] for r in read_jsonl(run.log_path)] == [1, 2, 3]
    assert run.checkpointer.load()["note"] == 1


def test_a_run_folder_says_its_identity_from_the_first_step(tmp_path):
    identity = {"kind": "ralimp", "fit": "paper", "hidden": [2, 3]}
    run = Run(name="unfinished", out=tmp_path, identity=identity, seed=0, device="cpu")
    model = torch.nn.Linear(3, 2)
    trainer = Trainer(
        run,
        model,
        {"adam": torch.optim.Adam(model.parameters(), lr=0.1)},
        steps=3,
        schedule=schedule("constant", 0, 3),
        show_progress=False,
    )
    x, calls = torch.randn(4, 3), []

    def stop_after_one_step(step, batch):
        calls.append(step)
        if len(calls) > 1:
            raise KeyboardInterrupt  # killed mid-run: no record, no checkpoint
        return trainer.forward(x).square().mean()

    with pytest.raises(KeyboardInterrupt):
        trainer.fit(stop_after_one_step)
    assert not (run.dir / "record.json").exists()
    assert not (run.dir / "checkpoint.pt").exists()
    assert json.loads((run.dir / "identity.json").read_text()) == identity
    assert sorted(p.name for p in run.dir.iterdir() if p.suffix == ".tmp") == []  # written whole


def _lock_toy(out):
    run = Run(name="locked", out=out, identity={}, seed=0, device="cpu")
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return Trainer(run, model, optimizer, steps=3, checkpoint_every=1, show_progress=False)


def test_a_second_trainer_of_a_run_in_training_is_refused_and_the_run_is_free_after(tmp_path):
    first, x, refusals = _lock_toy(tmp_path), torch.randn(4, 3), []

    def loss(step, batch):
        if step == 1:  # the first trains: a second start on the same run (another open of its lock)
            with pytest.raises(RuntimeError, match=r"locked: another process trains this run now \("):
                _lock_toy(tmp_path).fit(lambda step, batch: x.sum())
            refusals.append(step)
        return first.forward(x).square().mean()

    first.fit(loss)
    assert refusals == [1]
    assert first.step == 3
    second = _lock_toy(tmp_path)  # the first returned: the run is free again (resumes at its end)
    second.fit(lambda step, batch: x.sum())
    assert second.step == 3


def test_a_run_killed_mid_training_leaves_its_lock_free(tmp_path):
    first, x = _lock_toy(tmp_path), torch.randn(4, 3)

    def killed_at_step_two(step, batch):
        if step == 2:
            raise KeyboardInterrupt
        return first.forward(x).square().mean()

    with pytest.raises(KeyboardInterrupt):
        first.fit(killed_at_step_two)
    resumed = _lock_toy(tmp_path)
    resumed.fit(lambda step, batch: resumed.forward(x).square().mean())
    assert resumed.step == 3


@pytest.mark.parametrize(
    ("phases", "message"),
    [
        (
            [("adam", 2), ("lbfgs", 2)],
            r"phases: \[\('adam', 2\), \('lbfgs', 2\)\] add up to other than steps=3",
        ),
        ([("adam", 2), ("sgd", 1)], r"phases: \['sgd'\] name no optimizer; expected \['adam', 'lbfgs'\]"),
        ([], r"phases: needed to run several optimizers \(\['adam', 'lbfgs'\]\)"),
    ],
)
def test_phases_that_do_not_fit_fail_at_construction(tmp_path, phases, message):
    run = Run(name="bad", out=tmp_path, identity={}, seed=0, device="cpu")
    model, optimizers = _two_optimizers()
    with pytest.raises(ValueError, match=message):
        Trainer(run, model, optimizers, steps=3, phases=phases)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"steps": 0}, "steps: expected an integer >= 1"),
        ({"on_nan": "skip"}, "on_nan: expected one of raise, stop, got 'skip'"),
        ({"grad_clip": -1.0}, "grad_clip: expected a number >= 0, got -1.0"),
        ({"log_every": 0}, "log_every: expected an integer >= 1"),
    ],
)
def test_bad_loop_settings_fail_at_construction(tmp_path, setting, message):
    run = Run(name="bad", out=tmp_path, identity={}, seed=0, device="cpu")
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match=message):
        Trainer(run, model, torch.optim.SGD(model.parameters(), lr=0.1), **{"steps": 2, **setting})


def _toy_run_context(out):
    return Run(name="toy", out=out, identity={"steps": 12}, seed=3, device="cpu")


def test_unless_finished_runs_the_body_of_a_new_run(tmp_path):
    assert _toy_run_context(tmp_path).unless_finished(lambda run: run.name) == "toy"


def test_unless_finished_skips_a_finished_run(tmp_path):
    _toy_run(tmp_path, None)
    assert _toy_run_context(tmp_path).unless_finished(lambda run: "ran") is None


def test_group_settings_are_the_values_of_that_groups_fields_only():
    from dataclasses import dataclass

    from app_common.fields import OutputFields, RuntimeFields, group_settings

    @dataclass(frozen=True, kw_only=True)
    class Quick(RuntimeFields, OutputFields):
        steps: int = 3

    quick = Quick(device="cpu", dtype="bfloat16", threads=1, steps=5)
    assert group_settings(quick, RuntimeFields) == {"device": "cpu", "dtype": "bfloat16", "threads": 1}
