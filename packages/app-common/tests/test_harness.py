"""The training harness: resume equal to an unbroken run, NaN policy, phases, schedules, parameter groups."""

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import app_common as ac
from app_common.testing import assert_resume_equals_unbroken


def _toy_run(
    out, on_save, *, steps=12, on_nan="raise", poison_at=None, lbfgs_steps=0, accumulate=1, data=True
):
    """A tiny classifier with dropout, trained through the harness; returns its record."""
    trainer = ac.Trainer(
        name="toy",
        out=out,
        identity={"steps": steps},
        seed=3,
        steps=steps + lbfgs_steps,
        device="cpu",
        grad_clip=0.5,
        log_every=2,
        eval_every=4,
        checkpoint_every=3,
        on_nan=on_nan,
        show_progress=False,
        on_save=on_save,
    )
    if (record := trainer.finished()) is not None:
        return record
    model = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 3))
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 5, generator=generator), torch.randint(0, 3, (40,), generator=generator)
    adam = torch.optim.AdamW(ac.param_groups(model, 0.1), lr=0.05)
    optimizers = {"adam": adam}
    phases = [("adam", steps)]
    if lbfgs_steps:
        optimizers["lbfgs"] = torch.optim.LBFGS(model.parameters(), max_iter=3)
        phases.append(("lbfgs", lbfgs_steps))
    noise = torch.Generator().manual_seed(1)
    forward = trainer.setup(
        model, optimizers, phases=phases, schedule=ac.schedule("cosine", 3, steps), state={"noise": noise}
    )

    def loss_fn(step, batch):
        inputs, labels = batch if data else (x, y)
        inputs = inputs + 0.01 * torch.randn(inputs.shape, generator=noise)
        loss = F.cross_entropy(forward(inputs), labels)
        return loss * math.nan if step == poison_at else loss

    def evaluate(step):
        model.eval()
        with torch.no_grad():
            return {"val_loss": F.cross_entropy(model(x), y).item()}

    trainer.fit(
        loss_fn,
        data=ac.TrainData(TensorDataset(x, y), 8) if data else None,
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
    assert set(ac.CORE_KEYS) <= set(record)
    assert record["steps"] == 12
    assert record["trainable_parameters"] == record["num_parameters"] == 5 * 16 + 16 + 16 * 3 + 3
    assert record["details"] == {"note": "toy"}
    assert ac.finished_record(tmp_path, "toy")["metrics"] == record["metrics"]
    assert ac.read_jsonl(tmp_path / "results.jsonl") == [record]
    log = ac.read_jsonl(ac.run_dir(tmp_path, "toy") / "log.jsonl")
    assert [r["step"] for r in log if "train_loss" in r] == [2, 4, 6, 8, 10, 12]
    assert [r["step"] for r in log if "val_loss" in r] == [4, 8, 12]
    assert ac.flat_record(record)["val_loss"] == record["metrics"]["val_loss"]
    # a second call skips the finished run
    assert _toy_run(tmp_path, None) == record
    assert len(ac.read_jsonl(tmp_path / "results.jsonl")) == 1


def test_nan_policy_stop_records_the_step_and_skips_the_update(tmp_path):
    record = _toy_run(tmp_path, None, on_nan="stop", poison_at=5)
    assert record["diverged_at"] == 5
    assert record["steps"] == 5
    with pytest.raises(RuntimeError, match=r"toy: the training loss became nan at step 6"):
        _toy_run(tmp_path / "raise", None, poison_at=5)


def test_a_checkpoint_of_another_world_size_or_identity_is_refused(tmp_path):
    _toy_run(tmp_path, None)
    path = ac.run_dir(tmp_path, "toy") / "checkpoint.pt"
    (ac.run_dir(tmp_path, "toy") / "record.json").unlink()
    state = torch.load(path, weights_only=True)
    torch.save({**state, "rng": state["rng"] * 2}, path)
    with pytest.raises(ValueError, match="saved by 2 processes; resume it with as many"):
        _toy_run(tmp_path, None)
    with pytest.raises(ValueError, match=r"steps: 12 -> 10"):
        _toy_run(tmp_path, None, steps=10)


def test_micro_batches_accumulate_to_the_mean_gradient(tmp_path):
    seen = []

    trainer = ac.Trainer(
        name="acc", out=tmp_path, identity={}, seed=0, steps=1, device="cpu", show_progress=False
    )
    weight = torch.nn.Parameter(torch.zeros(()))
    model = torch.nn.Module()
    model.weight = weight
    sgd = torch.optim.SGD([weight], lr=1.0)
    trainer.setup(model, sgd)

    def loss_fn(step, micro):
        seen.append(micro)
        return weight * (micro + 1)

    trainer.fit(loss_fn, accumulate=4)
    assert seen == [0, 1, 2, 3]
    assert weight.item() == pytest.approx(-(1 + 2 + 3 + 4) / 4)


def test_schedules_warm_up_linearly_and_decay_to_final():
    cosine = ac.schedule("cosine", 4, 10, final=0.1)
    assert [cosine(t) for t in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert cosine(4) == pytest.approx(1.0)
    assert cosine(10) == pytest.approx(0.1)
    assert cosine(50) == pytest.approx(0.1)
    linear = ac.schedule("linear", 0, 10)
    assert linear(0) == 1.0
    assert linear(5) == pytest.approx(0.5)
    assert ac.schedule("constant", 2, 10)(7) == 1.0
    with pytest.raises(ValueError, match="schedule"):
        ac.schedule("cosin", 0, 10)


def test_param_groups_decay_matrices_only_and_never_ralimp_coefficients():
    model = torch.nn.Module()
    model.fc = torch.nn.Linear(3, 4)
    model.node_cos = torch.nn.Parameter(torch.zeros(2, 3))
    model.pos_embed = torch.nn.Parameter(torch.zeros(1, 5, 4))
    groups = ac.param_groups(model, 0.1, lr=1e-3, lr_scales=[("fc.", 10.0)])
    by_id = {id(p): g for g in groups for p in g["params"]}
    assert by_id[id(model.fc.weight)]["weight_decay"] == 0.1
    assert by_id[id(model.fc.weight)]["lr"] == pytest.approx(1e-2)
    assert by_id[id(model.fc.bias)]["weight_decay"] == 0.0
    assert by_id[id(model.node_cos)]["weight_decay"] == 0.0
    assert by_id[id(model.pos_embed)]["weight_decay"] == 0.0
    with pytest.raises(ValueError, match="lr_scales"):
        ac.param_groups(model, 0.1, lr_scales=[("fc.", 2.0)])


def test_the_vocabulary_contract_names_aliases_other_meanings_and_missing_subcommands():
    from dataclasses import dataclass

    from app_common.testing import assert_vocabulary, vocabulary_problems

    @dataclass(frozen=True, kw_only=True)
    class Good(ac.RuntimeFields, ac.OptimizerFields):
        warmup_steps: int = ac.option("warmup_steps", 10, help="this app's default")

    parser, commands = ac.app_parser("toy", "A toy app.")
    for name in ("train", "quick", "report", "list"):
        ac.add_dataclass_arguments(commands.add_parser(name), Good)
    assert_vocabulary(parser)

    bad, commands = ac.app_parser("bad", "A bad app.")
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

    parser, commands = ac.app_parser("toy", "A toy app.")
    commands.add_parser("train", description=f"Trains, see {markup}.")
    problems = vocabulary_problems(parser)
    assert any(p.startswith("toy train: --help shows markup") for p in problems)


def test_from_config_reads_the_shared_fields_and_lets_overrides_win(tmp_path):
    from dataclasses import dataclass

    @dataclass(frozen=True, kw_only=True)
    class Config(ac.RuntimeFields, ac.OptimizerFields, ac.EvalFields, ac.OutputFields):
        seed: int = 4
        steps: int = 7
        grad_clip: float = 0.5
        eval_every: int = 3
        log_every: int = 2
        checkpoint_every: int = 0  # 0: no checkpoints besides those after evaluations
        out: Path = tmp_path

    config = Config(device="cpu", resume=False)
    trainer = ac.Trainer.from_config(config, name="cfg", show_progress=False)
    assert (trainer.out, trainer.seed, trainer.steps, trainer.resume) == (tmp_path, 4, 7, False)
    assert (trainer.grad_clip, trainer.eval_every, trainer.log_every) == (0.5, 3, 2)
    assert trainer.checkpoint_every is None
    assert trainer.checkpointer.identity == ac.run_identity(config)

    grid_point = ac.Trainer.from_config(
        config, name="cfg-s9", seed=9, steps=11, identity={"run": "cfg-s9"}, show_progress=False
    )
    assert (grid_point.seed, grid_point.steps) == (9, 11)
    assert grid_point.checkpointer.identity == {"run": "cfg-s9"}


def test_from_config_without_eval_fields_keeps_the_trainer_defaults_and_names_a_missing_field(tmp_path):
    from dataclasses import dataclass

    @dataclass(frozen=True, kw_only=True)
    class Bare(ac.RuntimeFields, ac.OptimizerFields, ac.OutputFields):
        seed: int = 0
        out: Path = tmp_path

    trainer = ac.Trainer.from_config(Bare(), name="bare", show_progress=False)
    assert (trainer.eval_every, trainer.log_every, trainer.checkpoint_every) == (None, 10, None)

    @dataclass(frozen=True, kw_only=True)
    class NoSeed(ac.RuntimeFields, ac.OptimizerFields, ac.OutputFields):
        out: Path = tmp_path

    with pytest.raises(AttributeError, match="NoSeed has no field seed"):
        ac.Trainer.from_config(NoSeed(), name="no-seed")
    assert ac.Trainer.from_config(NoSeed(), name="no-seed", seed=1, show_progress=False).seed == 1
    with pytest.raises(ValueError, match=r"seed: expected an integer >= 0, got \(0, 1\)"):
        ac.Trainer.from_config(Bare(), name="grid", seed=(0, 1))


def _toy_trainer(out):
    return ac.Trainer(name="toy", out=out, identity={"steps": 12}, seed=3, steps=12, device="cpu")


def test_run_unless_finished_runs_the_body_of_a_new_run(tmp_path):
    assert _toy_trainer(tmp_path).run_unless_finished(lambda trainer: trainer.name) == "toy"


def test_run_unless_finished_skips_a_finished_run(tmp_path):
    _toy_run(tmp_path, None)
    assert _toy_trainer(tmp_path).run_unless_finished(lambda trainer: "ran") is None


def test_group_settings_are_the_values_of_that_groups_fields_only():
    from dataclasses import dataclass

    from app_common.fields import OutputFields, RuntimeFields, group_settings

    @dataclass(frozen=True, kw_only=True)
    class Quick(RuntimeFields, OutputFields):
        steps: int = 3

    quick = Quick(device="cpu", dtype="bfloat16", threads=1, steps=5)
    assert group_settings(quick, RuntimeFields) == {"device": "cpu", "dtype": "bfloat16", "threads": 1}
