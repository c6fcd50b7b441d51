"""layer-fit: data protocol, methods at a budget, training, resume, report, CLI."""

import csv
import dataclasses
import json
import math
import re
from pathlib import Path

import pytest
import torch

import ralimp
from app_common.records import flat_record
from app_common.results import append_jsonl, read_jsonl
from app_common.testing import assert_resume_equals_unbroken
from layer_fit import (
    METHODS,
    PAPER_METHODS,
    FitConfig,
    FitModel,
    ReportConfig,
    build,
    eckart_young_floor,
    fit_one,
    information_floor,
    make_data,
    report,
    run_fit,
    standardize,
    train,
)
from layer_fit.cli import build_parser, main
from layer_fit.floors import singular_values
from layer_fit.methods import train_projections

TINY = {"samples": 128, "dim": 16, "log_every": 5, "checkpoint_every": 0, "device": "cpu"}


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


@pytest.mark.parametrize("budget", [16, 32, 40])
def test_every_method_spends_the_budget_exactly_through_ralimp_create(budget):
    x = torch.randn(64, 16)
    for method in ("lowrank", "eugen", "snnk", "ralimp", "linear"):
        model = build(method, "gelu", budget, dim=16, seed=0, sample=x)
        assert model.layer.num_random_features == budget, method
    layer = build("ralimp", "gelu", 32, dim=16, seed=0, sample=x).layer
    assert (layer.poly_degree, layer.num_freqs) == (2, 3)
    assert layer.num_atoms in (0, 1)  # the variance-aware fit chooses
    # App. D.1: 8 + 2 * 3 * 4; without the atom its 24 features go to the polynomial block
    assert layer.poly_matrices[0].num_features == 32 - 24 * layer.num_atoms
    assert all(m.num_features == 4 for m in layer.freq_matrices)
    assert float(layer.tau) == 1.0
    paper = build("ralimp-paper", "gelu", 32, dim=16, seed=0, sample=x).layer
    assert (paper.num_atoms, paper.options.fit, paper.num_random_features) == (1, "paper", 32)
    assert layer.exponent_guard
    assert not paper.exponent_guard  # the paper's layer runs whatever its variance does


def test_ralimp_omega_trains_the_projections_that_ralimp_keeps_fixed():
    data = make_data("gelu", samples=TINY["samples"], dim=TINY["dim"], seed=0)
    fixed = build("ralimp", "gelu", 16, dim=TINY["dim"], seed=0, sample=data.calibration_sample)
    model = build("ralimp-omega", "gelu", 16, dim=TINY["dim"], seed=0, sample=data.calibration_sample)
    assert model.state_dict().keys() == fixed.state_dict().keys()  # checkpoints keep their layout
    projections = [m.weight for m in (*model.layer.poly_matrices, *model.layer.freq_matrices)]
    trained = {id(p) for p in model.parameters()}
    assert projections
    assert all(id(p) in trained for p in projections)
    assert not any(m.weight.requires_grad for m in fixed.layer.poly_matrices)
    torch.nn.functional.mse_loss(model(data.x), data.y).backward()
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in projections)
    # the same start as ralimp: the projections are the same draws
    assert torch.equal(model(data.x), fixed(data.x))
    for control, fixed_name in (("eugen-omega", "eugen"), ("snnk-omega", "snnk")):
        trained_layer = build(control, "gelu", 16, dim=TINY["dim"], seed=0, sample=data.x).layer
        fixed_layer = build(fixed_name, "gelu", 16, dim=TINY["dim"], seed=0, sample=data.x).layer
        names = {n for n, _ in fixed_layer.named_parameters()}
        extra = {n for n, _ in trained_layer.named_parameters()} - names
        assert extra
        assert all(n.endswith(".weight") for n in extra)
        assert {n for n, _ in fixed_layer.named_buffers()} >= extra  # the fixed method's projection buffers
    with pytest.raises(ValueError, match="expected dense random projection matrices in LowRank"):
        train_projections(build("lowrank", "gelu", 16, dim=TINY["dim"], seed=0, sample=data.x).layer)


def test_paper_literal_turns_off_balance_and_the_output_head_and_records_the_departures():
    literal = FitConfig(paper_literal=True)
    assert (literal.balance, literal.affine, literal.departures()) == (1.0, False, [])
    default = FitConfig()
    assert default.balance == "auto"
    assert len(default.departures()) == 2
    x = torch.randn(64, 16)
    model = build(
        "ralimp", "gelu", 32, dim=16, seed=0, sample=x, balance=literal.balance, output_affine=False
    )
    assert float(model.layer.scale) == 1.0
    assert not model.output_affine
    balanced = build("ralimp", "gelu", 32, dim=16, seed=0, sample=x, balance="auto").layer
    assert float(balanced.scale) != 1.0


def test_information_floor_is_the_least_squares_residual_and_eckart_young_the_tail_of_the_spectrum():
    gen = torch.Generator().manual_seed(0)
    phi = torch.randn(200, 5, generator=gen, dtype=torch.float64)
    mix = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    noise = 0.1 * torch.randn(200, 7, generator=gen, dtype=torch.float64)
    y = phi @ mix + 3.0 + noise
    # y is in the span of [phi, 1] up to the noise: the floor is the noise's residual, about 0.01
    floor = information_floor(phi, y)
    assert 0.005 < floor < 0.0101
    assert information_floor(phi, phi @ mix) < 1e-20
    assert information_floor(torch.full((200, 5), float("inf")), y) == float("inf")
    sigma = singular_values(y - y.mean(0))
    best_rank_2 = torch.linalg.svd(y - y.mean(0), full_matrices=False)
    u, s, vh = best_rank_2
    approx = u[:, :2] @ torch.diag(s[:2]) @ vh[:2]
    direct = float(((y - y.mean(0)) - approx).pow(2).mean())
    assert eckart_young_floor(sigma, 2, y.numel()) == pytest.approx(direct, rel=1e-10)
    assert eckart_young_floor(sigma, 7, y.numel()) == 0.0


def test_records_carry_both_floors_and_the_trained_feature_methods_stay_above_them():
    data = make_data("gelu", samples=TINY["samples"], dim=TINY["dim"], seed=0)
    config = FitConfig(steps=30, **TINY)
    for method in ("eugen", "ralimp-psi"):
        record = flat_record(fit_one(data, method, 8, 0, config, device=torch.device("cpu"), progress=False))
        assert record["feature_dim"] > 8
        assert record["mse"] >= record["information_floor"] * (1 - 1e-4)  # Psi alone cannot beat its features
        assert record["information_floor"] >= record["eckart_young_floor"] - 1e-9
    lowrank = flat_record(fit_one(data, "lowrank", 8, 0, config, device=torch.device("cpu"), progress=False))
    assert lowrank["information_floor"] is None


@pytest.mark.parametrize("method", [*PAPER_METHODS, "linear"])
def test_each_method_loss_falls_on_a_tiny_run(method):
    data = make_data("gelu", samples=TINY["samples"], dim=TINY["dim"], seed=0)
    config = FitConfig(steps=60, **TINY)
    record = flat_record(fit_one(data, method, 16, 0, config, device=torch.device("cpu"), progress=False))
    assert record["departures"] == config.departures()
    assert not record["diverged"]
    assert record["mse"] < 0.8 * record["mse_init"]
    losses = [loss for _, loss in record["curve"]]
    assert losses[-1] < losses[0]
    assert [step for step, _ in record["curve"]] == list(range(5, 61, 5))  # mean loss of every 5 steps


def test_a_killed_grid_resumes_bit_identical_to_an_unbroken_one(tmp_path):
    def run(out, on_save):
        config = FitConfig(
            activation=("tanh",),
            layer=("eugen", "ralimp"),
            features=(16,),
            seed=(1,),
            steps=20,
            out=out,
            **{**TINY, "checkpoint_every": 10},
        )
        return run_fit(config, progress=False, on_checkpoint=on_save)

    assert_resume_equals_unbroken(run, tmp_path, kill_step=10)


def test_a_diverging_run_stops_and_records_the_step(tmp_path):
    data = make_data("gelu", samples=TINY["samples"], dim=TINY["dim"], seed=0)
    config = FitConfig(steps=10, lr=1e30, grad_clip=0.0, **TINY)
    record = flat_record(fit_one(data, "eugen", 8, 0, config, device=torch.device("cpu"), out=tmp_path))
    assert record["diverged"]
    assert record["mse"] is None
    assert record["diverged_at_step"] == record["diverged_at"] < 10


def test_train_writes_one_line_per_run_skips_finished_runs_and_refuses_another_protocol(tmp_path):
    config = FitConfig(
        activation=("sigmoid",),
        layer=("lowrank", "eugen"),
        features=(8,),
        seed=(0, 1),
        steps=5,
        out=tmp_path,
        **TINY,
    )
    results = run_fit(config, progress=False)
    records = [flat_record(r) for r in read_jsonl(results)]
    assert sorted((r["method"], r["seed"]) for r in records) == [
        ("eugen", 0),
        ("eugen", 1),
        ("lowrank", 0),
        ("lowrank", 1),
    ]
    # the apps' one naming scheme: a readable label, then a digest of the run's identity
    assert all(
        re.fullmatch(rf"sigmoid-{r['method']}-b8-s{r['seed']}-[0-9a-f]{{8}}", r["name"]) for r in records
    )
    assert config.run_name("sigmoid", "eugen", 8, 0) != dataclasses.replace(config, lr=0.5).run_name(
        "sigmoid", "eugen", 8, 0
    )
    assert config.run_name("sigmoid", "eugen", 8, 0) == dataclasses.replace(
        config, device="auto", threads=2, checkpoint_every=3, shard="0/2"
    ).run_name("sigmoid", "eugen", 8, 0)
    run_fit(config, progress=False)
    assert len(read_jsonl(results)) == 4
    # a run finished before names had a digest (its folder the label alone) is reused, not run again
    runs = tmp_path / "runs"
    (runs / records[0]["name"]).rename(runs / records[0]["name"][: -len("-12345678")])
    run_fit(config, progress=False)
    assert len(read_jsonl(results)) == 4
    assert not (runs / records[0]["name"]).exists()
    run_fit(dataclasses.replace(config, seed=(0, 1, 2)), progress=False)
    assert len(read_jsonl(results)) == 6
    with pytest.raises(ValueError, match=r"holds runs of other settings \(steps: 5 -> 6\).*--no-resume"):
        run_fit(dataclasses.replace(config, steps=6), progress=False)
    run_fit(dataclasses.replace(config, steps=6, resume=False), progress=False)  # starts over
    assert len(read_jsonl(results)) == 4


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
                        "information_floor": None if method == "lowrank" else mean * factor / 2,
                        "eckart_young_floor": None if method == "lowrank" else mean * factor / 4,
                        "feature_dim": None if method == "lowrank" else 41,
                    }
                )
    records.append({**records[0], "seed": 9, "mse": None, "diverged": True})
    return records


def test_report_tables_and_plots_from_a_synthetic_results_file(tmp_path):
    path = tmp_path / "results.jsonl"
    for record in _synthetic_records():
        append_jsonl(path, record)
    texts = report(ReportConfig(results=path, table_features=32))
    out = tmp_path / "report"
    table = (out / "table.md").read_text()
    assert texts["table"] in table
    gelu = next(line for line in table.splitlines() if line.startswith("| gelu"))
    assert "1.000e-01 ± 1.0e-02" in gelu
    assert "| ralimp" in gelu
    by_method = [[c.strip() for c in line.split("|")[1:-1]] for line in texts["by_method"].splitlines()]
    assert by_method[0] == ["method", "gelu", "tanh"]
    assert ["ralimp", "0.1 ± 0.01 (3)", "0.3 ± 0.01 (3)"] in by_method  # method x activation, seeds counted
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
    append_jsonl(path, {**_synthetic_records()[0], "activation": "silu"})  # one budget: not in the sweep
    report(ReportConfig(results=path, table_features=32))
    assert "silu" not in (out / "sweep.md").read_text()
    floors = (out / "floors.md").read_text()
    gelu_floors = next(line for line in floors.splitlines() if line.startswith("| gelu"))
    assert "5.000e-02 / 2.500e-02 (F=41)" in gelu_floors  # ralimp: mean MSE 0.1, floors 0.05 and 0.025
    assert "ralimp: trained MSE / information floor = 2 .. 2 over 2 activations" in texts["floors"]
    assert (out / "sweep_floors.md").is_file()
    for name in ("mse_bars.png", "mse_vs_budget.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_of_runs_that_all_diverged_draws_labels_and_prints_no_nan(tmp_path):
    path = tmp_path / "results.jsonl"
    for record in _synthetic_records()[:3]:  # gelu lowrank at budget 16, three seeds
        append_jsonl(path, {**record, "mse": None, "diverged": True})
        append_jsonl(path, {**record, "method": "eugen", "mse": 1.6e23})  # far above the axis: cut, labelled
    texts = report(ReportConfig(results=path, table_features=16))
    assert "diverged (3 diverged)" in texts["table"]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in texts["by_method"].splitlines()]
    assert ["lowrank", "diverged (3)"] in rows
    assert ["eugen", "1.6e+23 ± 0 (3)"] in rows
    assert "nan" not in texts["table"].lower()
    assert (tmp_path / "report" / "mse_bars.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_reads_the_committed_records_written_before_and_after_run_names_had_a_digest(tmp_path):
    committed = Path(__file__).parents[1] / "records" / "fig2-paper.jsonl"
    records = read_jsonl(committed)
    digest = [bool(re.fullmatch(r"[a-z]+-[a-z-]+-b\d+-s\d+-[0-9a-f]{8}", r["name"])) for r in records]
    assert set(digest) == {True, False}  # both kinds of name
    texts = report(ReportConfig(results=committed, report_dir=tmp_path, table_features=32))
    gelu = next(line for line in texts["table"].splitlines() if line.startswith("| gelu"))
    assert "±" in gelu
    # a run recorded twice (a folder of runs of the old names continued under the new ones) is refused
    doubled = tmp_path / "doubled.jsonl"
    for record in (records[0], {**records[0], "name": f"{records[0]['name']}-1a2b3c4d"}):
        append_jsonl(doubled, record)
    with pytest.raises(ValueError, match=r"\(gelu, ralimp, 32, 0\) is recorded twice.*1a2b3c4d"):
        report(ReportConfig(results=doubled, report_dir=tmp_path))


def test_report_refuses_mixed_protocols(tmp_path):
    path = tmp_path / "results.jsonl"
    records = _synthetic_records()
    append_jsonl(path, records[0])
    append_jsonl(path, {**records[1], "steps": 10})
    with pytest.raises(ValueError, match="2 different protocols"):
        report(ReportConfig(results=path))


def test_cli_lists_methods_and_names_bad_arguments(capsys, tmp_path):
    assert main(["list"]) == 0
    assert capsys.readouterr().out.split() == METHODS.names()
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--layer", "nope", "--out", str(tmp_path), "--steps", "1"])
    assert exit_info.value.code == 2
    assert "unknown method 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--threads", "-3", "--out", str(tmp_path)])
    assert "--threads: expected an integer >= 0, got -3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["report", str(tmp_path / "missing.jsonl")])
    assert "missing.jsonl: no such results file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    assert "``" not in text
    assert "{float32,bfloat16}" in text
    assert "--paper-literal" in text


def test_cli_quick_reads_a_toml_config_and_prints_tables_with_floors(tmp_path, capsys):
    toml = tmp_path / "fit.toml"
    toml.write_text(
        f'out = "{tmp_path / "out"}"\nactivation = ["tanh"]\nlayer = ["eugen"]\nfeatures = [8]\n'
        "seed = [0]\nsteps = 3\nsamples = 64\ndim = 8\n"
    )
    assert main(["quick", "--config", str(toml), "--steps", "4"]) == 0
    printed = capsys.readouterr().out
    assert "| tanh" in printed
    assert "(F=17)" in printed  # EUGen of degree 2 with 8 rows: 1 + 2 * 8 features
    assert "departure from the paper: balance='auto'" in printed
    (record,) = read_jsonl(tmp_path / "out" / "results.jsonl")
    assert record["steps"] == 4


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="--steps: expected an integer >= 1, got 0"):
        FitConfig(steps=0)
    with pytest.raises(ValueError, match="--features: expected an integer >= 1"):
        FitConfig(features=(0,))
    assert math.isclose(FitConfig().lr, 1e-2)
    assert FitConfig().steps == 3000
    assert FitConfig().seed == tuple(range(10))
    assert json.dumps(FitConfig().protocol())


def test_projection_floor_is_zero_on_the_rows_own_span_and_one_orthogonal_to_them():
    # checked against what a projection floor must be, not against a second implementation
    from layer_fit.floors import projection_floor

    gen = torch.Generator().manual_seed(0)
    w = torch.randn(3, 8, generator=gen, dtype=torch.float64)
    b = torch.zeros(3, dtype=torch.float64)
    assert projection_floor(w, b, w) < 1e-12  # the pre-activations themselves are seen
    basis = torch.linalg.qr(w.mT, mode="complete").Q[:, 3:].mT  # directions orthogonal to every row
    assert projection_floor(w, b, basis) == pytest.approx(1.0, abs=1e-9)
    one = projection_floor(w, b, torch.randn(2, 8, generator=gen, dtype=torch.float64))
    assert 0.0 < one < 1.0


def test_the_app_keeps_to_the_flag_vocabulary_and_has_no_import_cycle():
    from app_common.testing import assert_app_contract
    from layer_fit.cli import build_parser

    assert_app_contract(build_parser(), "layer_fit")


def test_weight_matrix_draws_the_projections_of_every_random_feature_method(tmp_path):
    x = torch.randn(64, 16)
    for method in ("ralimp", "eugen", "snnk", "ralimp-width", "eugen-width"):
        layer = build(method, "gelu", 32, dim=16, seed=0, sample=x, weight_matrix="orf").layer
        matrices = [m for m in layer.modules() if type(m).__module__.startswith("rf_matrices.")]
        assert matrices, method
        assert all(type(m).__name__ == "ORF" for m in matrices), method
    build("lowrank-width", "gelu", 32, dim=16, seed=0, sample=x, weight_matrix="orf")  # draws none
    # the default stays out of a run's identity (runs recorded before the flag resume); another value is in it
    assert "weight_matrix" not in FitConfig().protocol()
    assert FitConfig(weight_matrix="orf").protocol()["weight_matrix"] == "orf"
    config = FitConfig(
        activation=("tanh",), layer=("lowrank",), features=(8,), seed=(0,), steps=2, out=tmp_path, **TINY
    )
    run_fit(config, progress=False)
    with pytest.raises(ValueError, match=r"holds runs of other settings \(weight_matrix: 'base' -> 'orf'\)"):
        run_fit(dataclasses.replace(config, weight_matrix="orf"), progress=False)
    args = build_parser().parse_args(["train", "--weight-matrix", "orf", "--out", str(tmp_path)])
    assert args.weight_matrix == "orf"


@pytest.fixture
def refusing_method():
    """A method registered for one test whose builder raises, as a layer that cannot start does."""

    def build(linear, activation, budget, *, seed, sample, balance, weight_matrix):
        raise ValueError("x: this method refuses every layer")

    METHODS.register("refuses")(build)
    yield "refuses"
    METHODS.unregister("refuses")


def test_a_method_that_does_not_start_is_recorded_and_the_grid_goes_on(tmp_path, refusing_method):
    config = FitConfig(
        activation=("gelu",),
        layer=(refusing_method, "eugen"),
        features=(32,),
        seed=(0,),
        steps=5,
        out=tmp_path,
        **TINY,
    )
    results = run_fit(config, progress=False)
    raw = {r["details"]["method"]: r for r in read_jsonl(results)}
    assert (raw[refusing_method]["steps"], raw[refusing_method]["train_seconds"]) == (0, 0.0)
    records = {method: flat_record(r) for method, r in raw.items()}
    idle = records[refusing_method]
    reason = "ValueError: x: this method refuses every layer"
    assert idle["not_started"] == reason
    assert (idle["mse"], idle["diverged"]) == (None, False)
    assert records["eugen"]["mse"] is not None
    assert "not_started" not in records["eugen"]
    run_fit(config, progress=False)  # recorded: the rerun skips it
    assert len(read_jsonl(results)) == 2
    texts = report(ReportConfig(results=results, table_features=32))
    row = next(line for line in texts["table"].splitlines() if line.startswith("| gelu"))
    assert f"does not start ({reason})" in row
    assert row.split("|")[-3].strip() == "eugen"  # the lowest of the methods that ran
    assert f"does not start: gelu / {refusing_method} / B=32, 1 run(s): {reason}" in texts["table"]
    assert "not_started" in (tmp_path / "report" / "table.csv").read_text()
    by_method = next(
        line for line in texts["by_method"].splitlines() if line.startswith(f"| {refusing_method}")
    )
    assert "does not start" in by_method


def test_a_first_loss_that_is_not_finite_does_not_start(tmp_path, monkeypatch):
    class NotANumber(torch.nn.Module):
        def forward(self, x):
            return x * math.nan

    monkeypatch.setattr(train, "build", lambda *args, **kw: FitModel(NotANumber(), 16, output_affine=False))
    data = make_data("gelu", samples=TINY["samples"], dim=TINY["dim"], seed=0)
    record = flat_record(fit_one(data, "eugen", 8, 0, FitConfig(steps=3, **TINY), device=torch.device("cpu")))
    assert record["not_started"] == "the first loss is nan"
    assert record["mse"] is None
