"""layer-fit: data protocol, methods at a budget, training, resume, report, CLI."""

import csv
import json
import math

import pytest
import torch

import app_common as ac
import ralimp
from layer_fit import (
    METHODS,
    PAPER_METHODS,
    FitConfig,
    ReportConfig,
    build,
    fit_one,
    make_data,
    ralimp_split,
    report,
    run_fit,
    standardize,
)
from layer_fit import train as train_module
from layer_fit.cli import main

TINY = {"samples": 128, "dim": 16, "log_every": 5, "checkpoint_every": 0}


@pytest.mark.parametrize("activation", ["gelu", "silu", "tanh", "sigmoid", "softsign"])
def test_data_is_standardized_per_column_and_follows_the_protocol(activation):
    data = make_data(activation, samples=512, dim=24, seed=3, dtype=torch.float64)
    for a in (data.x, data.y):
        assert a.shape == (512, 24)
        assert float(a.mean(0).abs().max()) < 1e-10
        torch.testing.assert_close(a.std(0, unbiased=False), torch.ones(24, dtype=torch.float64))
    # the same W and X, drawn i.i.d. Unif[0, 1] in this order, the pre-activation centered per unit
    gen = torch.Generator().manual_seed(3)
    w = torch.rand(24, 24, generator=gen, dtype=torch.float64)
    x = torch.rand(512, 24, generator=gen, dtype=torch.float64)
    assert float(x.min()) >= 0
    assert float(x.max()) <= 1
    t = x @ w.T
    fn = ralimp.ACTIVATIONS.get(activation)
    torch.testing.assert_close(data.x, standardize(x))
    torch.testing.assert_close(data.y, standardize(fn(t - t.mean(0))))
    glob = make_data(activation, samples=512, dim=24, seed=3, center="global", dtype=torch.float64)
    torch.testing.assert_close(glob.y, standardize(fn(t - t.mean())))
    torch.testing.assert_close(glob.x, data.x)


def test_data_rejects_unknown_centering_and_activation():
    with pytest.raises(ValueError, match="center: expected one of column, global"):
        make_data("gelu", samples=8, dim=4, center="row")
    with pytest.raises(ValueError, match="unknown activation 'swish2'"):
        make_data("swish2", samples=8, dim=4)


def test_budgets_map_onto_the_constructors_as_the_paper_counts():
    x = torch.randn(64, 16)
    for method in ("lowrank", "eugen", "snnk", "ralimp"):
        model = build(method, "gelu", 32, dim=16, seed=0, sample=x)
        assert model.layer.num_random_features == 32, method
    layer = build("ralimp", "gelu", 32, dim=16, seed=0, sample=x).layer
    assert (layer.poly_degree, layer.num_atoms, layer.num_freqs) == (2, 1, 3)
    assert layer.poly_matrices[0].num_features == 8
    assert all(m.num_features == 4 for m in layer.freq_matrices)
    assert float(layer.tau) == 1.0
    assert ralimp_split(256) == (64, 32)
    with pytest.raises(ValueError, match="budget: RaLiMP splits B into B/4 \\+ 6 \\* B/8"):
        ralimp_split(12)


@pytest.mark.parametrize("method", [*PAPER_METHODS, "linear"])
def test_each_method_loss_falls_on_a_tiny_run(method):
    data = make_data("gelu", samples=TINY["samples"], dim=TINY["dim"], seed=0)
    config = FitConfig(steps=60, **TINY)
    record = fit_one(data, method, 16, 0, config, device=torch.device("cpu"), progress=False)
    assert not record["diverged"]
    assert record["mse"] < 0.8 * record["mse_init"]
    losses = [loss for _, loss in record["curve"]]
    assert losses[-1] < losses[0]
    assert record["curve"][0][0] == 0
    assert len(record["curve"]) == 12


def test_killed_run_resumes_from_its_checkpoint_to_the_unbroken_result(tmp_path, monkeypatch):
    data = make_data("tanh", samples=TINY["samples"], dim=TINY["dim"], seed=0)
    config = FitConfig(steps=20, **{**TINY, "checkpoint_every": 10})
    cpu = torch.device("cpu")
    unbroken = fit_one(data, "eugen", 16, 1, config, device=cpu, progress=False)

    real_save = ac.save_checkpoint

    class Killed(Exception):
        pass

    def save_then_die(path, state):
        real_save(path, state)
        raise Killed

    path = tmp_path / "run.pt"
    monkeypatch.setattr(train_module.ac, "save_checkpoint", save_then_die)
    with pytest.raises(Killed):
        fit_one(data, "eugen", 16, 1, config, device=cpu, checkpoint=path, progress=False)
    assert ac.load_checkpoint(path)["step"] == 10
    monkeypatch.setattr(train_module.ac, "save_checkpoint", real_save)
    resumed = fit_one(data, "eugen", 16, 1, config, device=cpu, checkpoint=path, progress=False)
    assert resumed["mse"] == pytest.approx(unbroken["mse"], rel=1e-5)
    assert [s for s, _ in resumed["curve"]] == [s for s, _ in unbroken["curve"]]
    assert [v for _, v in resumed["curve"]] == pytest.approx([v for _, v in unbroken["curve"]], rel=1e-5)
    assert not path.exists()


def test_run_writes_one_line_per_run_and_skips_finished_runs(tmp_path):
    config = FitConfig(
        activations=("sigmoid",),
        methods=("lowrank", "eugen"),
        budgets=(8,),
        seeds=2,
        steps=5,
        out=tmp_path,
        **TINY,
    )
    results = run_fit(config, progress=False)
    records = ac.read_jsonl(results)
    assert sorted((r["method"], r["seed"]) for r in records) == [
        ("eugen", 0),
        ("eugen", 1),
        ("lowrank", 0),
        ("lowrank", 1),
    ]
    run_fit(config, progress=False)
    assert len(ac.read_jsonl(results)) == 4
    run_fit(FitConfig(**{**vars(config), "seeds": 3}), progress=False)
    assert len(ac.read_jsonl(results)) == 6
    run_fit(FitConfig(**{**vars(config), "steps": 6}), progress=False)  # another protocol: run again
    assert len(ac.read_jsonl(results)) == 10


def _synthetic_records():
    """gelu: ralimp lowest; tanh: eugen lowest; two budgets; three seeds with known spreads."""
    means = {
        ("gelu", "lowrank"): 0.4,
        ("gelu", "eugen"): 0.2,
        ("gelu", "ralimp"): 0.1,
        ("tanh", "lowrank"): 0.5,
        ("tanh", "eugen"): 0.05,
        ("tanh", "ralimp"): 0.3,
    }
    protocol = FitConfig().protocol()
    records = []
    for (activation, method), mean in means.items():
        for budget, factor in ((16, 2.0), (32, 1.0)):
            for seed, offset in enumerate((-0.01, 0.0, 0.01)):
                records.append(
                    {
                        "activation": activation,
                        "method": method,
                        "budget": budget,
                        "seed": seed,
                        **protocol,
                        "mse": mean * factor + offset,
                        "diverged": False,
                        "train_seconds": 1.0,
                    }
                )
    records.append({**records[0], "seed": 9, "mse": None, "diverged": True})
    return records


def test_report_tables_and_plots_from_a_synthetic_results_file(tmp_path):
    path = tmp_path / "results.jsonl"
    for record in _synthetic_records():
        ac.append_jsonl(path, record)
    texts = report(ReportConfig(results=path, budget=32))
    out = tmp_path / "report"
    table = (out / "table.md").read_text()
    assert texts["table"] in table
    gelu = next(line for line in table.splitlines() if line.startswith("| gelu"))
    assert "1.000e-01 ± 1.0e-02" in gelu
    assert "| ralimp" in gelu
    tanh = next(line for line in table.splitlines() if line.startswith("| tanh"))
    assert "5.000e-02 ± 1.0e-02" in tanh
    assert tanh.split("|")[-3].strip() == "eugen"
    assert "ralimp lowest mean MSE at budget 32: 1 of 2 activations (gelu); the claim does not hold" in table
    rows = list(csv.DictReader((out / "table.csv").read_text().splitlines()))
    assert len(rows) == 6
    assert {r["budget"] for r in rows} == {"32"}
    sweep = list(csv.DictReader((out / "sweep.csv").read_text().splitlines()))
    assert len(sweep) == 12
    lowrank16 = next(
        r for r in sweep if r["activation"] == "gelu" and r["method"] == "lowrank" and r["budget"] == "16"
    )
    assert float(lowrank16["mse_mean"]) == pytest.approx(0.8)
    assert (lowrank16["seeds"], lowrank16["diverged"]) == ("3", "1")
    assert "(1 diverged)" in (out / "sweep.md").read_text()
    ac.append_jsonl(path, {**_synthetic_records()[0], "activation": "silu"})  # one budget: not in the sweep
    report(ReportConfig(results=path, budget=32))
    assert "silu" not in (out / "sweep.md").read_text()
    for name in ("mse_bars.png", "mse_vs_budget.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_refuses_mixed_protocols(tmp_path):
    path = tmp_path / "results.jsonl"
    records = _synthetic_records()
    ac.append_jsonl(path, records[0])
    ac.append_jsonl(path, {**records[1], "steps": 10})
    with pytest.raises(ValueError, match="2 different protocols"):
        report(ReportConfig(results=path))


def test_cli_lists_methods_and_names_bad_arguments(capsys, tmp_path):
    assert main(["methods"]) == 0
    assert capsys.readouterr().out.split() == METHODS.names()
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--methods", "nope", "--out", str(tmp_path), "--steps", "1"])
    assert exit_info.value.code == 2
    assert "unknown method 'nope'; known names:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["report", str(tmp_path / "missing.jsonl")])
    assert "missing.jsonl: no such results file" in capsys.readouterr().err


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="steps: expected a positive integer, got 0"):
        FitConfig(steps=0)
    with pytest.raises(ValueError, match="budgets: expected positive integers"):
        FitConfig(budgets=(0,))
    assert math.isclose(FitConfig().lr, 1e-2)
    assert FitConfig().steps == 3000
    assert FitConfig().seeds == 10
    assert json.dumps(FitConfig().protocol())
