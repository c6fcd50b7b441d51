import json
import math

import pytest
import torch

from app_common.records import flat_record
from nerf_pinn.cli import main
from nerf_pinn.paper import PAPER, check_comparable, load_runs, variant_label, variants
from nerf_pinn.siren import SirenFamily, psnr


def record(kind, seed, metric, *, family="siren", diverged_at=None, params=100, **config):
    """A record in the schema `compare` writes (`app_common.records.make_record`), small."""
    name = f"{kind}-s{seed}-0123abcd"
    settings = {"steps": 500, "features": 64, "fit": "variance", "seed": seed, "out": "anywhere", **config}
    return {
        "name": name,
        "config": settings,
        "seed": seed,
        "finished_at": f"2026-01-0{seed + 1}T00:00:00+0000",
        "diverged_at": diverged_at,
        "train_seconds": 1.0,
        "metrics": {{"siren": "psnr", "pinn": "relative_l2"}[family]: metric, "time_ratio": 1.0},
        "details": {
            "family": family,
            "kind": kind,
            "params": params,
            "inference_params": params // 2 if kind != "dense" else params,
            "inference_seconds": 0.1,
            "initial_loss": 1.0,
            "final_loss": 0.01,
        },
    }


def write_run(out, rec=None, *, name=None, losses=()):
    """A run folder under ``out/runs``: ``record.json`` if finished, ``log.jsonl`` with ``losses``."""
    run = out / "runs" / (name or rec["name"])
    run.mkdir(parents=True)
    (run / "log.jsonl").write_text(
        "".join(json.dumps({"step": i + 1, "train_loss": x, "lr": 1e-4}) + "\n" for i, x in enumerate(losses))
    )
    if rec is not None:
        (run / "record.json").write_text(json.dumps(rec))


def test_an_out_folder_gives_every_seeds_record_and_its_unfinished_runs_once(tmp_path):
    out = tmp_path / "siren"
    seeds = [record("dense", 0, 30.0), record("dense", 1, 32.0), record("dense", 2, 33.5)]
    for rec in seeds:
        write_run(out, rec, losses=[0.3, 0.1])
    write_run(out, name="ralimp-s0-89abcdef", losses=[0.3, 0.04])
    # results.jsonl holds only the last comparison's records: given as well, they count once
    (out / "results.jsonl").write_text(json.dumps(seeds[2]) + "\n")
    records, unfinished = load_runs([out, out / "results.jsonl"])
    assert sorted(r["seed"] for r in records) == [0, 1, 2]
    (run,) = unfinished
    assert (run.kind, run.label, run.seed, run.step, run.train_loss) == ("ralimp", "ralimp", 0, 2, 0.04)
    dense, ralimp = variants(records, unfinished, "psnr")
    assert dense.values == (30.0, 32.0, 33.5)
    assert dense.seeds == (0, 1, 2)
    assert ralimp.values == ()
    assert ralimp.unfinished == (run,)


def test_the_logs_the_repository_keeps_beside_a_results_file_count_only_where_no_record_is(tmp_path):
    (tmp_path / "siren.jsonl").write_text(json.dumps(record("dense", 0, 34.0)) + "\n")
    (tmp_path / "dense.log.jsonl").write_text(json.dumps({"step": 1, "train_loss": 0.3}) + "\n")
    (tmp_path / "ralimp.log.jsonl").write_text(json.dumps({"step": 64, "train_loss": 0.03}) + "\n")
    paths = [tmp_path / name for name in ("siren.jsonl", "dense.log.jsonl", "ralimp.log.jsonl")]
    records, unfinished = load_runs(paths)
    assert [r["kind"] for r in records] == ["dense"]
    assert [(u.kind, u.seed, u.step) for u in unfinished] == [("ralimp", None, 64)]
    (tmp_path / "mlp.log.jsonl").write_text(json.dumps({"step": 1, "train_loss": 0.3}) + "\n")
    with pytest.raises(ValueError, match="'mlp' names no variant"):
        load_runs([tmp_path / "mlp.log.jsonl"])
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_runs([tmp_path / "absent.jsonl"])


def test_an_unfinished_run_joins_the_variant_its_identity_names_not_only_its_kind(tmp_path):
    out = tmp_path / "pinn"
    write_run(out, record("ralimp", 0, 0.01, family="pinn"), losses=[1.0, 0.1])
    write_run(out, name="ralimp-s0-89abcdef", losses=[1.0, 0.5])  # the paper layout, same seed
    identity = {"family": "pinn", "kind": "ralimp", "fit": "paper", "steps": 500}
    (out / "runs" / "ralimp-s0-89abcdef" / "identity.json").write_text(json.dumps(identity))
    records, unfinished = load_runs([out])
    ((run,), (default, paper)) = unfinished, variants(records, unfinished, "relative_l2")
    assert (run.label, run.seed, run.step) == ("ralimp, paper layout", 0, 2)
    assert (default.label, default.values, default.unfinished) == ("ralimp", (0.01,), ())
    assert (paper.label, paper.values, paper.unfinished) == ("ralimp, paper layout", (), (run,))
    # as the repository keeps it: <name>.log.jsonl and <name>.identity.json beside the records
    kept = tmp_path / "records"
    kept.mkdir()
    (kept / "ralimp-s0-89abcdef.log.jsonl").write_text(run.source.read_text())
    (kept / "ralimp-s0-89abcdef.identity.json").write_text(json.dumps(identity))
    _, (kept_run,) = load_runs(
        [out / "runs" / "ralimp-s0-0123abcd" / "record.json", kept / "ralimp-s0-89abcdef.log.jsonl"]
    )
    assert kept_run.label == "ralimp, paper layout"


def test_the_psnr_of_a_siren_training_loss_bounds_the_evaluated_psnr_from_below():
    generator = torch.Generator().manual_seed(0)
    image = torch.rand(16, 16, generator=generator, dtype=torch.float64)
    for spread in (0.05, 0.6):  # inside [0, 1]: equal; far outside: the evaluation's clipping helps
        prediction = image + spread * torch.randn(16, 16, generator=generator, dtype=torch.float64)
        loss = float(((2 * prediction - 1) - (2 * image - 1)).pow(2).mean())  # SirenFamily.loss's scale
        inside = bool(((prediction >= 0) & (prediction <= 1)).all())
        bound = SirenFamily.metric_from_loss(loss)
        if inside:
            assert bound == pytest.approx(psnr(prediction, image), abs=1e-9)
        assert bound <= psnr(prediction, image) + 1e-9
        assert bound == pytest.approx(
            10 * math.log10(1 / float((prediction - image).pow(2).mean())), abs=1e-9
        )


def test_records_of_other_settings_are_refused_and_the_variants_are_named_by_their_fit():
    def flat(*args, **kw):
        return flat_record(record(*args, **kw))

    dense, ralimp = flat("dense", 0, 30.0), flat("ralimp", 0, 20.0, features=32)
    check_comparable([dense, ralimp])  # a layer setting may differ between variants
    with pytest.raises(ValueError, match=r"ran different settings \(features: 32 vs 64\)"):
        check_comparable([ralimp, flat("ralimp", 1, 21.0)])
    with pytest.raises(ValueError, match=r"steps: 500 vs 10000"):
        check_comparable([dense, flat("dense", 1, 30.0, steps=10000)])
    with pytest.raises(ValueError, match="one family"):
        check_comparable([dense, flat("dense", 1, 0.1, family="pinn")])
    assert variant_label(flat("ralimp", 0, 20.0, fit="paper")) == "ralimp, paper layout"
    assert variant_label(ralimp) == "ralimp"


def test_report_draws_the_paper_figure_from_one_seed_and_names_diverged_and_unfinished_runs(tmp_path, capsys):
    out = tmp_path / "pinn"
    write_run(out, record("dense", 0, 0.004, family="pinn", params=3021), losses=[1.0, 0.1])
    write_run(out, record("snnk", 0, float("nan"), family="pinn", diverged_at=5), losses=[1.0, float("nan")])
    write_run(out, name="eugen-s0-0123abcd", losses=[1.0, 0.5])  # the PINN's loss bounds no error
    records, unfinished = load_runs([out])
    groups = variants(records, unfinished, "relative_l2")
    assert [(v.label, v.values, v.diverged_at, len(v.unfinished)) for v in groups] == [
        ("dense", (0.004,), (), 0),
        ("snnk", (), (6,), 0),
        ("eugen", (), (), 1),
    ]
    figure = tmp_path / "img" / "pinn-paper.png"
    assert main(["report", str(out), "--figure", str(figure)]) == 0
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "figure: " + str(figure) in capsys.readouterr().out
    assert (out / "report" / "results.md").read_text().count("| dense") == 1
    assert PAPER["pinn"].ralimp_size == pytest.approx(0.58)


def test_report_gives_a_seed_column_when_records_of_several_seeds_are_given(tmp_path, capsys):
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(record("dense", s, 30.0 + s)) + "\n" for s in (0, 1)))
    assert main(["report", str(path)]) == 0
    table = (tmp_path / "report" / "results.md").read_text()
    assert table.splitlines()[0].startswith("| variant | seed | psnr")
    assert (tmp_path / "report" / "paper.png").is_file()
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(tmp_path / "empty")])
    assert exit_.value.code == 2
    assert "no such file" in capsys.readouterr().err
