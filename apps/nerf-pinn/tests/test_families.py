import dataclasses
import json
import re

import numpy as np
import pytest
import torch
from torch import nn

import ralimp
from app_common.config import read_toml
from app_common.records import flat_record
from app_common.results import read_jsonl
from app_common.testing import assert_resume_equals_unbroken
from nerf_pinn.cli import main
from nerf_pinn.config import NerfConfig, PinnConfig, SirenConfig
from nerf_pinn.experiment import compare, train_variant
from nerf_pinn.layers import FeedForward, linearize_mlp_layers
from nerf_pinn.nerf import NerfFamily
from nerf_pinn.pinn import PinnFamily
from nerf_pinn.scenes import load_blender, load_tiny_nerf, render_synthetic_scene
from nerf_pinn.siren import SirenFamily

LAYER_CLASSES = {"ralimp": ralimp.RaLiMP, "snnk": ralimp.SNNK, "eugen": ralimp.EUGen}


def tiny_pinn(tmp_path, **kw):
    base = {
        "depth": 3,
        "width": 8,
        "num_boundary": 32,
        "num_collocation": 64,
        "steps": 40,
        "lbfgs_steps": 0,
        "lr": 3e-3,
        "features": 16,
        "device": "cpu",
        "out": tmp_path / "pinn",
        "checkpoint_every": 1000,
        "replace": "hidden",
    }
    return PinnConfig(**{**base, **kw})


def tiny_siren(tmp_path, **kw):
    base = {"size": 12, "depth": 3, "width": 16, "steps": 40, "features": 16, "device": "cpu"}
    base["out"] = tmp_path / "siren"
    return SirenConfig(**{**base, **kw})


def tiny_nerf(tmp_path, **kw):
    base = {
        "image_size": 8,
        "num_views": 6,
        "eval_views": 1,
        "depth": 3,
        "width": 16,
        "pos_freqs": 2,
        "samples": 8,
        "batch_rays": 64,
        "steps": 30,
        "lr": 1e-2,
        "features": 16,
        "device": "cpu",
        "out": tmp_path / "nerf",
    }
    return NerfConfig(**{**base, **kw})


def train(family, kind, tmp_path):
    _, model, losses = train_variant(family, kind)
    return model, losses


def test_tiny_pinn_run_lowers_its_loss(tmp_path):
    _, losses = train(PinnFamily(tiny_pinn(tmp_path, lbfgs_steps=1)), "dense", tmp_path)
    assert len(losses) == 41
    assert losses[-1] < 0.5 * losses[0]


def test_tiny_siren_run_lowers_its_loss(tmp_path):
    _, losses = train(SirenFamily(tiny_siren(tmp_path)), "dense", tmp_path)
    assert losses[-1] < 0.5 * losses[0]


def loss_on_all_training_rays(family, model):
    """Mean squared colour error of ``model`` over every training ray, rendered without jitter."""
    with torch.no_grad():
        colour = family.render(model, family.origins, family.directions, jitter=False)
    return float((colour - family.colours).pow(2).mean())


def test_tiny_nerf_run_lowers_its_loss(tmp_path):
    family = NerfFamily(tiny_nerf(tmp_path, steps=60, batch_rays=320))
    before = loss_on_all_training_rays(family, family.build("dense"))
    _, model, _ = train_variant(family, "dense")
    assert loss_on_all_training_rays(family, model) < 0.5 * before


@pytest.mark.parametrize("kind", ["ralimp", "snnk", "eugen"])
def test_the_replacements_plug_into_the_pinn_and_train(kind, tmp_path):
    family = PinnFamily(tiny_pinn(tmp_path, features=32, depth=4, replace="alternate"))
    model, losses = train(family, kind, tmp_path)
    replaced = [type(layer).__name__ for layer in model.layers]
    name = LAYER_CLASSES[kind].__name__
    assert replaced == ["FeedForward", name, "FeedForward", name]
    assert all(np.isfinite(losses))
    assert min(losses[-5:]) < losses[0]


@pytest.mark.parametrize("kind", ["ralimp", "snnk", "eugen"])
def test_the_replacements_plug_into_siren_and_train(kind, tmp_path):
    family = SirenFamily(tiny_siren(tmp_path, replace="alternate"))
    model, losses = train(family, kind, tmp_path)
    assert isinstance(model.layers[1], LAYER_CLASSES[kind])
    assert all(np.isfinite(losses))
    assert min(losses[-5:]) < losses[0]


def test_ralimp_fits_sin_on_the_layers_preactivation_range():
    torch.manual_seed(0)
    layers = nn.ModuleList([FeedForward(4, 8, "sin", scale=2.0)])
    x = torch.rand(256, 4) * 2 - 1
    with torch.no_grad():
        t_max = float(layers[0].preactivation(x).abs().max())
        dense_out = layers[0](x)
    linearize_mlp_layers(layers, "ralimp", budget=16, indices=[0], inputs=[x], num_freqs=3)
    layer = layers[0]
    assert isinstance(layer, ralimp.RaLiMP)
    assert layer.fit.interval == pytest.approx((-1.1 * t_max, 1.1 * t_max))
    # in expectation over the projections the layer computes its fit of sin(scale * (W x + b)); the fit weighs
    # bias^2 against the exact variance (fit="variance"), and at budget 16 its expected error over the
    # projections is below half the target's energy (20 draws: 0.47; the least-squares fit's: 47)
    t = (x.double() @ layer.weight.double().T + layer.bias.double()).detach()
    torch.testing.assert_close(layer.expected_output(t).detach(), layer.fit(t), atol=1e-6, rtol=0)
    sizes = layer.sizes()
    error = ralimp.fits.expected_squared_error(layer.fit, torch.sin, layer.calibration, sizes)
    assert error / float(dense_out.double().pow(2).mean()) < 0.6


@pytest.mark.parametrize("kind", ["ralimp", "eugen"])
def test_the_replacements_take_the_place_of_the_nerf_trunk_layer(kind, tmp_path):
    model = NerfFamily(tiny_nerf(tmp_path)).build(kind)
    assert isinstance(model.layers[1], LAYER_CLASSES[kind])


@pytest.mark.parametrize("kind", ["ralimp", "eugen"])
def test_a_nerf_with_replacements_lowers_its_loss_on_the_training_rays(kind, tmp_path):
    family = NerfFamily(tiny_nerf(tmp_path, steps=60, batch_rays=320))
    before = loss_on_all_training_rays(family, family.build(kind))
    _, model, _ = train_variant(family, kind)
    assert loss_on_all_training_rays(family, model) < 0.5 * before  # measured: 0.18 (ralimp), 0.17 (eugen)


@pytest.mark.parametrize("budget", [16, 32, 40])
def test_every_kind_spends_the_budget_exactly_through_ralimp_create(budget):
    layers = nn.ModuleList([FeedForward(4, 8, "tanh"), FeedForward(8, 8, "tanh")])
    for kind in ("ralimp", "snnk", "eugen"):
        stack = nn.ModuleList([FeedForward(4, 8, "tanh"), FeedForward(8, 8, "tanh")])
        stack.load_state_dict(layers.state_dict())
        linearize_mlp_layers(
            stack, kind, budget=budget, indices=[1], inputs=[torch.randn(64, 4), torch.randn(64, 8)]
        )
        assert stack[1].num_random_features == budget, kind
    stack = nn.ModuleList([FeedForward(4, 8, "tanh"), FeedForward(8, 8, "tanh")])
    linearize_mlp_layers(
        stack, "ralimp", budget=32, indices=[1], inputs=[None, torch.randn(64, 8)], num_freqs=3
    )
    # App. D.1: 8 + 2 * 1 * 3 * 4; the atoms the variance-aware fit leaves out give their 24 to the polynomial
    assert stack[1].poly_matrices[0].num_features == 32 - 2 * stack[1].num_atoms * 3 * 4
    with pytest.raises(ValueError, match="budget"):
        linearize_mlp_layers(stack, "ralimp", budget=2, indices=[0], inputs=[torch.randn(64, 4)], num_freqs=3)


def test_compare_writes_records_table_and_plots_and_resumes(tmp_path, capsys):
    config = tiny_pinn(tmp_path, layer=("dense", "eugen"), steps=6, checkpoint_every=2)
    records = compare(PinnFamily(config))
    out = config.out
    lines = [flat_record(json.loads(line)) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in lines] == ["dense", "eugen"] == [r["kind"] for r in records]
    assert lines[0]["time_ratio"] == 1.0
    assert lines[1]["time_ratio"] > 0
    assert lines[1]["params"] > 0
    assert np.isfinite(lines[1]["relative_l2"])
    assert "| eugen" in (out / "results.md").read_text()
    csv_lines = (out / "results.csv").read_text().splitlines()
    assert csv_lines[0].startswith("kind,relative_l2,params")
    assert csv_lines[2].startswith("eugen,")
    assert (out / "pinn.png").stat().st_size > 0
    assert (out / "losses.png").stat().st_size > 0
    # a second run finds the finished variants and does not train again
    again = compare(PinnFamily(config))
    assert [r["train_seconds"] for r in again] == [r["train_seconds"] for r in records]
    assert [r["relative_l2"] for r in again] == [r["relative_l2"] for r in records]


def test_dense_from_restores_a_finished_dense_run_of_another_folder_and_times_it_here(tmp_path):
    first = tiny_pinn(tmp_path, layer=("dense",), steps=6, out=tmp_path / "dense-only")
    (dense,) = compare(PinnFamily(first))
    (dense_run,) = (first.out / "runs").glob("dense-s0-*")  # the apps' one scheme: label, then digest
    assert re.fullmatch(r"dense-s0-[0-9a-f]{8}", dense_run.name)
    kept = (dense_run / "record.json").read_text()
    config = tiny_pinn(tmp_path, layer=("dense", "eugen"), steps=6, dense_from=first.out)
    records = compare(PinnFamily(config))
    assert [r["kind"] for r in records] == ["dense", "eugen"]
    assert records[0]["relative_l2"] == dense["relative_l2"]  # the restored weights, not a new training
    assert records[0]["train_seconds"] == dense["train_seconds"]
    assert records[0]["time_ratio"] == 1.0
    assert records[1]["time_ratio"] > 0
    lines = [
        flat_record(json.loads(line)) for line in (config.out / "results.jsonl").read_text().splitlines()
    ]
    assert [r["kind"] for r in lines] == ["dense", "eugen"]
    assert not list((config.out / "runs").glob("dense-*"))
    assert (dense_run / "record.json").read_text() == kept
    with pytest.raises(ValueError, match=r"--dense-from: .* holds no finished dense run"):
        compare(PinnFamily(tiny_pinn(tmp_path, layer=("dense",), dense_from=tmp_path / "nothing")))
    with pytest.raises(
        ValueError, match=rf"no finished dense run .*{dense_run.name} of other settings \(steps: 6 -> 5\)"
    ):
        compare(PinnFamily(tiny_pinn(tmp_path, layer=("dense",), steps=5, dense_from=first.out)))


def test_other_settings_are_another_run_and_settings_that_do_not_change_the_variant_resume_it(tmp_path):
    config = tiny_pinn(tmp_path, layer=("dense",), steps=3)
    (first,) = compare(PinnFamily(config))
    (run,) = (config.out / "runs").iterdir()
    kept = (run / "record.json").read_text()
    compare(PinnFamily(tiny_pinn(tmp_path, layer=("dense",), steps=5)))  # another identity: another folder
    names = sorted(p.name for p in (config.out / "runs").iterdir())
    assert len(names) == 2
    assert run.name in names
    assert all(re.fullmatch(r"dense-s0-[0-9a-f]{8}", name) for name in names)
    assert (run / "record.json").read_text() == kept
    # settings that do not change the variant (here the timing rounds) find the finished run
    (again,) = compare(PinnFamily(tiny_pinn(tmp_path, layer=("dense",), steps=3, time_repeats=2)))
    assert again["train_seconds"] == first["train_seconds"]
    assert sorted(p.name for p in (config.out / "runs").iterdir()) == names


@pytest.mark.parametrize("family", ["pinn", "siren", "nerf"])
def test_a_killed_run_resumes_bit_identical_to_an_unbroken_one(tmp_path, family):
    # PINN through its L-BFGS phase; NeRF with its ray generator (checkpointed with the run).
    def run(out, on_save):
        if family == "pinn":
            config = tiny_pinn(out, layer=("dense", "eugen"), steps=6, lbfgs_steps=2, checkpoint_every=4)
            return compare(PinnFamily(dataclasses.replace(config, out=out)), on_checkpoint=on_save)
        if family == "siren":
            config = tiny_siren(out, layer=("dense", "ralimp"), steps=8, checkpoint_every=4)
            return compare(SirenFamily(dataclasses.replace(config, out=out)), on_checkpoint=on_save)
        config = tiny_nerf(out, layer=("dense", "eugen"), steps=8, checkpoint_every=4)
        return compare(NerfFamily(dataclasses.replace(config, out=out)), on_checkpoint=on_save)

    clock = ("time_ratio", "inference_seconds")
    assert_resume_equals_unbroken(run, tmp_path, kill_step=4, clock_keys=clock)


def test_synthetic_scene_round_trips_through_the_tiny_nerf_loader(tmp_path):
    path = render_synthetic_scene(tmp_path / "scene.npz", num_views=5, size=8, samples=64)
    scene = load_tiny_nerf(path, held_out=2)
    assert scene.images.shape == (5, 8, 8, 3)
    assert scene.poses.shape == (5, 4, 4)
    assert scene.train == [0, 1, 2]
    assert scene.test == [3, 4]
    assert scene.images.min() >= 0
    assert scene.images.max() <= 1
    centre = scene.images[:, 3:5, 3:5].mean()
    corner = scene.images[:, 0, 0].mean()
    assert centre > 0.2 > corner  # the shapes sit in the middle of every view, the background is black


def test_blender_loader_reads_transforms_and_composites_on_white(tmp_path):
    from PIL import Image

    for split, count in (("train", 2), ("val", 1), ("test", 1)):
        (tmp_path / split).mkdir()
        frames = []
        for i in range(count):
            rgba = np.zeros((4, 4, 4), dtype=np.uint8)
            rgba[1:3, 1:3] = (255, 0, 0, 255)  # an opaque red square on a transparent background
            Image.fromarray(rgba).save(tmp_path / split / f"r_{i}.png")
            frames.append({"file_path": f"./{split}/r_{i}", "transform_matrix": np.eye(4).tolist()})
        (tmp_path / f"transforms_{split}.json").write_text(
            json.dumps({"camera_angle_x": 0.69, "frames": frames})
        )
    scene = load_blender(tmp_path)
    assert scene.images.shape == (3, 4, 4, 3)
    assert scene.train == [0, 1]
    assert scene.test == [2]
    torch.testing.assert_close(scene.images[0, 0, 0], torch.ones(3))
    torch.testing.assert_close(scene.images[0, 1, 1], torch.tensor([1.0, 0.0, 0.0]))
    assert scene.focal == pytest.approx(0.5 * 4 / np.tan(0.5 * 0.69))
    assert load_blender(tmp_path, downscale=2).images.shape == (3, 2, 2, 3)


def test_missing_data_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"transforms_train\.json"):
        load_blender(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"nothing\.npz"):
        load_tiny_nerf(tmp_path / "nothing.npz")


def test_cli_refuses_bad_values_with_a_message(capsys, tmp_path):
    for argv, text in (
        (["pinn", "--layer", "ralimp", "--device", "cpu"], "--layer"),
        (
            ["train", "--family", "pinn", "--omega-0", "3", "--out", str(tmp_path)],
            "--omega-0: not a setting of the pinn",
        ),
        (["siren", "--threads", "-3"], "--threads: expected an integer >= 0, got -3"),
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        assert text in capsys.readouterr().err


def test_help_is_plain_text_with_the_shared_device_help(capsys):
    texts = []
    for command in ("pinn", "siren", "nerf"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        assert "``" not in text
        assert "{float32,bfloat16}" in text
        texts.append(" ".join(text.split("--device", 1)[1].split("--", 1)[0].split()))
    assert len(set(texts)) == 1


def test_train_family_runs_a_tiny_pinn_from_the_command_line(tmp_path, capsys):
    argv = [
        "train", "--family", "pinn", "--layer", "dense", "--depth", "2", "--width", "4",
        "--num-boundary", "8",
        "--num-collocation", "16", "--steps", "2", "--lbfgs-steps", "0", "--quadrature-nodes", "20",
        "--time-repeats", "1", "--device", "cpu", "--out", str(tmp_path / "p"),
    ]  # fmt: skip
    assert main(argv) == 0
    assert "| dense" in capsys.readouterr().out


def test_the_app_keeps_to_the_flag_vocabulary_and_has_no_import_cycle():
    from app_common.testing import assert_app_contract
    from nerf_pinn.cli import build_parser

    assert_app_contract(build_parser(), "nerf_pinn")


def test_report_rewrites_the_table_of_a_results_file(tmp_path, capsys):
    from nerf_pinn.cli import main

    config = tiny_pinn(tmp_path, layer=("dense",), steps=3, time_repeats=2)
    compare(PinnFamily(config))
    capsys.readouterr()
    assert main(["report", str(config.out / "results.jsonl"), "--report-dir", str(tmp_path / "rep")]) == 0
    assert "| dense" in capsys.readouterr().out
    assert (tmp_path / "rep" / "results.csv").read_text().startswith("kind,relative_l2,params")


def _closure(optimizer, loss_of):
    def closure():
        optimizer.zero_grad()
        loss = loss_of()
        loss.backward()
        return loss

    return closure


def _rosenbrock(x, scale=1.0):
    return scale * ((1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2)


def test_scipy_lbfgsb_names_its_convergence_and_then_leaves_the_parameters_alone():
    from nerf_pinn.pinn import ScipyLBFGSB

    target = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    x = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    optimizer = ScipyLBFGSB([x], max_iter=20, tolerance_grad=1e-9)
    closure = _closure(optimizer, lambda: (x - target).pow(2).sum())
    optimizer.step(closure)  # a quadratic: converged in far fewer than 20 iterations
    assert optimizer.stop_reason is not None
    assert "CONVERGENCE" in optimizer.stop_reason
    assert torch.allclose(x.detach(), target, atol=1e-8)
    iterations = optimizer.counters()[0]
    assert 0 < iterations < 20
    before = x.detach().clone()
    optimizer.step(closure)
    assert torch.equal(x.detach(), before)
    assert optimizer.counters()[0] == iterations
    restored = ScipyLBFGSB([x], max_iter=20)
    restored.load_state_dict(optimizer.state_dict())
    assert (restored.stop_reason, restored.counters()) == (optimizer.stop_reason, optimizer.counters())


def test_a_pinn_run_whose_lbfgs_converges_stops_there_and_records_why(tmp_path):
    config = tiny_pinn(tmp_path, layer=("dense",), steps=2, lbfgs_steps=200, lbfgs_tolerance_change=1e-3)
    (record,) = compare(PinnFamily(config))
    assert record["lbfgs_stop"].startswith("L-BFGS-B: ")
    assert 0 < record["lbfgs_iterations"] < 20 * 200
    log = [
        r
        for r in read_jsonl(next((tmp_path / "pinn" / "runs").glob("dense-*")) / "log.jsonl")
        if "train_loss" in r
    ]
    assert len(log) < 2 + 200  # the run ended before its last step


def test_the_dense_run_is_shared_by_comparisons_that_differ_only_in_a_linearized_kind_setting(tmp_path):
    family = PinnFamily(tiny_pinn(tmp_path))
    other = PinnFamily(tiny_pinn(tmp_path, fit="paper", num_atoms=2, balance="1"))
    assert family.identity("dense") == other.identity("dense")
    assert family.identity("eugen") == other.identity("eugen")
    assert family.identity("ralimp") != other.identity("ralimp")


def test_the_table_says_where_a_variant_diverged_instead_of_printing_nan():
    from nerf_pinn.experiment import results_table

    common = {"params": 1, "inference_params": 1, "time_ratio": 1.0, "train_seconds": 1.0}
    records = [
        {"kind": "dense", "relative_l2": 0.1, "final_loss": 0.01, "diverged_at": None, **common},
        {"kind": "snnk", "relative_l2": float("nan"), "final_loss": 1e12, "diverged_at": 6, **common},
        # diverged at its first step: no finite loss was logged (final loss NaN)
        {"kind": "eugen", "relative_l2": 0.5, "final_loss": float("nan"), "diverged_at": 0, **common},
        # a finite training loss whose evaluation overflows
        {"kind": "ralimp", "relative_l2": float("inf"), "final_loss": 1e30, "diverged_at": None, **common},
    ]
    table = results_table(records, "relative_l2")
    assert "diverged at step 7" in table
    assert "diverged at step 1" in table
    assert "nan" not in table
    assert "| inf " not in table
    assert table.count("not finite") == 2


def test_a_float64_pinn_trains_in_float64(tmp_path):
    family = PinnFamily(tiny_pinn(tmp_path, precision="float64"))
    model = family.build("dense")
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    assert family.loss(model).dtype == torch.float64


def test_more_lbfgs_steps_continue_a_pinn_run_as_the_longer_run_would(tmp_path, capsys):
    def losses(out, lbfgs_steps):
        config = tiny_pinn(
            out, layer=("dense",), steps=3, lbfgs_steps=lbfgs_steps, lbfgs_tolerance_change=0.0
        )
        compare(PinnFamily(dataclasses.replace(config, out=out)))
        log = read_jsonl(next((out / "runs").glob("dense-*")) / "log.jsonl")
        return [r["train_loss"] for r in log if "train_loss" in r]

    losses(tmp_path / "continued", 1)
    continued = losses(tmp_path / "continued", 3)
    assert re.search(r"dense-s0-[0-9a-f]{8}: resuming at step 4", capsys.readouterr().out)
    assert continued == losses(tmp_path / "unbroken", 3)


def test_scipy_lbfgsb_goes_on_after_a_step_that_spent_its_iterations():
    from nerf_pinn.pinn import ScipyLBFGSB

    x = torch.tensor([-1.5, 2.0], dtype=torch.float64, requires_grad=True)
    optimizer = ScipyLBFGSB([x], max_iter=3, max_eval=100)
    closure = _closure(optimizer, lambda: _rosenbrock(x))  # far more than 3 iterations from this start
    for _ in range(2):
        optimizer.step(closure)
    assert optimizer.counters()[0] == 6
    assert optimizer.stop_reason is None


def test_scipy_lbfgsb_takes_the_same_steps_on_a_loss_a_billion_times_smaller():
    """Its curvature test is relative; torch's LBFGS drops each pair with ``y.s <= 1e-10`` (the stall)."""
    from nerf_pinn.pinn import ScipyLBFGSB

    ends = []
    for scale in (1.0, 1e-9):
        x = torch.tensor([-1.2, 1.0], dtype=torch.float64, requires_grad=True)
        optimizer = ScipyLBFGSB([x], max_iter=25, tolerance_grad=0.0, tolerance_change=0.0)
        optimizer.step(_closure(optimizer, lambda x=x, scale=scale: _rosenbrock(x, scale)))
        ends.append(x.detach().clone())
    assert torch.allclose(ends[0], ends[1], rtol=1e-6)
    torch_ends = []
    for scale in (1.0, 1e-9):
        x = torch.tensor([-1.2, 1.0], dtype=torch.float64, requires_grad=True)
        lbfgs = torch.optim.LBFGS([x], max_iter=25, line_search_fn="strong_wolfe", tolerance_grad=0.0)
        lbfgs.step(_closure(lbfgs, lambda x=x, scale=scale: _rosenbrock(x, scale)))
        torch_ends.append(x.detach().clone())
    assert not torch.allclose(torch_ends[0], torch_ends[1], rtol=1e-3)


def test_the_paper_config_runs_raissis_l_bfgs_b_in_float64():
    from pathlib import Path

    table = read_toml(Path(__file__).parents[1] / "configs" / "pinn-paper.toml")
    config = PinnConfig(**{k: v for k, v in table.items() if k != "out"})
    assert config.precision == "float64"
    assert config.lbfgs_steps * config.lbfgs_iterations == 50_000  # Raissi's maxiter
    # Raissi's gtol (scipy's default, which his code keeps) and ftol = machine epsilon
    assert (config.lbfgs_tolerance_grad, config.lbfgs_tolerance_change) == (1e-5, np.finfo(float).eps)
    assert (config.depth, config.width, config.num_boundary, config.num_collocation) == (8, 20, 100, 10_000)
