import csv
import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app_common.config import flat_settings
from app_common.records import flat_record
from app_common.results import append_jsonl, read_jsonl
from lra_bench import ReportConfig, SweepConfig, grid, report, run_name, run_sweep
from lra_bench.cli import main
from lra_bench.config import GRID


def _synthetic_results(path):
    """Two seeds of every cell; accuracy = base + seed, so the mean is base + 0.5 and the std 0.7071."""
    base = {"softmax": 40.0, "performer": 30.0, "oprf-orf": 35.0, "oprf-qmc": 36.0, "posrf-orf": 20.0}
    for (attention, acc), task, features, seed in itertools.product(
        base.items(), ("listops", "text"), (64, 128), (0, 1)
    ):
        bonus = 10.0 if task == "text" else 0.0
        append_jsonl(
            path,
            {
                "task": task,
                "attention": attention,
                "features": features,
                "seed": seed,
                "test_accuracy": (acc + bonus + seed) / 100,
                "train_seconds": 3600.0 * (1 + seed),
                "peak_memory_bytes": 2**30 * (2 + seed),
            },
        )


def test_report_writes_the_three_tables_as_markdown_and_csv_and_the_heatmaps(tmp_path):
    results = tmp_path / "results.jsonl"
    _synthetic_results(results)
    tables = report(ReportConfig(results=results, report_dir=tmp_path / "out"))
    out = tmp_path / "out"
    with (out / "table1.csv").open() as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    assert header[:4] == ["Model", "Acc L (%)", "Acc T (%)", "Acc mu (%)"]
    # Sorted by mean accuracy; mean (std) over the two seeds; time in hours and memory in GiB averaged.
    assert [r[0] for r in body] == ["softmax", "oprf-qmc", "oprf-orf", "performer", "posrf-orf"]
    assert body[0][1:4] == ["40.50 (0.71)", "50.50 (0.71)", "45.50"]
    assert body[0][header.index("Time mu (h)")] == "1.50"
    assert body[0][header.index("Mem L (GiB)")] == "2.500"
    assert tables["table1"].splitlines()[0].startswith("| Model")
    with (out / "table7.csv").open() as f:
        table7 = list(csv.reader(f))
    # Only the "<component>-<matrix>" attentions, one row per feature count.
    assert [r[:2] for r in table7[1:]] == [
        ["oprf-orf", "64"], ["oprf-orf", "128"], ["oprf-qmc", "64"], ["oprf-qmc", "128"],
        ["posrf-orf", "64"], ["posrf-orf", "128"],
    ]  # fmt: skip
    with (out / "table8.csv").open() as f:
        table8 = {(r[0], r[1], r[2]): r for r in list(csv.reader(f))[1:]}
    # f = oprf at 128: mean over orf (35.5) and qmc (36.5) on ListOps.
    assert table8[("f", "oprf", "128")][3] == "36.00"
    # W = orf at 64: mean over oprf (35.5) and posrf (20.5) on ListOps.
    assert table8[("W", "orf", "64")][3] == "28.00"
    assert (out / "table1.md").read_text().startswith("| Model")
    for features in (64, 128):
        png = out / f"figure4_f{features}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_refuses_an_empty_or_incomplete_results_file(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="no results yet"):
        report(ReportConfig(results=empty))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"task": "listops"}) + "\n")
    with pytest.raises(ValueError, match="record 1 lacks attention"):
        report(ReportConfig(results=bad))


def test_report_command_prints_table1(tmp_path, capsys):
    results = tmp_path / "results.jsonl"
    _synthetic_results(results)
    assert main(["report", str(results), "--table1-features", "64", "--time-unit", "min"]) == 0
    printed = capsys.readouterr().out
    assert "| softmax" in printed
    assert "Time L (min)" in printed
    assert (tmp_path / "report" / "table1.csv").is_file()


def test_table1_takes_the_papers_128_features_or_else_the_largest_count_of_the_results(tmp_path):
    from lra_bench.report import aggregate, table1_features

    results = tmp_path / "results.jsonl"
    _synthetic_results(results)
    records = [flat_record(r) for r in read_jsonl(results)]
    assert table1_features(aggregate(records)) == 128
    assert table1_features(aggregate(records), 64) == 64
    only_64 = [r for r in records if r["features"] == 64]
    assert table1_features(aggregate(only_64)) == 64
    for record in only_64:
        append_jsonl(tmp_path / "quick" / "results.jsonl", record)
    tables = report(ReportConfig(results=tmp_path / "quick" / "results.jsonl"))
    assert "| softmax" in tables["table1"]  # a quickstart's results (64 features) fill Table 1


def test_shards_split_the_grid_into_disjoint_parts_that_cover_it():
    sweep = SweepConfig(
        task=("listops", "image"), attention=("softmax", "oprf-orf"), attention_features=(64,), seed=(0, 1, 2)
    )
    everything = [run_name(c) for c in grid(sweep, {})]
    assert len(everything) == len(set(everything)) == 12
    parts = [[run_name(c) for c in grid(sweep, {})][i::3] for i in range(3)]
    assert sorted(name for part in parts for name in part) == sorted(everything)
    with pytest.raises(ValueError, match="--shard: expected 0 <= i < n"):
        SweepConfig(shard="3/3")
    with pytest.raises(ValueError, match="--shard: expected 'i/n'"):
        SweepConfig(shard="half")


def _settings(config):
    """The flat settings of a run, without the grid's fields."""
    return {k: v for k, v in flat_settings(config).items() if k not in GRID and k != "resume"}


def test_sweep_shards_run_their_part_and_a_rerun_skips_finished_runs(tmp_path, data, helpers):
    base = helpers.tiny_config(tmp_path, steps=2, eval_every=2, eval_batches=1)
    settings = _settings(base)
    sweep = SweepConfig(
        task=("listops",), attention=("softmax", "performer"), attention_features=(16,), seed=(0,)
    )
    first = run_sweep(dataclasses.replace(sweep, shard="0/2"), settings)
    second = run_sweep(dataclasses.replace(sweep, shard="1/2"), settings)
    assert (len(first["ran"]), len(second["ran"]), first["failed"], second["failed"]) == (1, 1, [], [])
    records = read_jsonl(helpers.results(base))
    assert sorted(r["details"]["attention"] for r in records) == ["performer", "softmax"]
    again = run_sweep(sweep, settings)
    assert again == {"done": first["ran"] + second["ran"], "ran": [], "failed": []}
    assert len(read_jsonl(helpers.results(base))) == 2


def test_sweep_checks_every_attention_before_the_first_run(tmp_path, data, helpers):
    settings = _settings(helpers.tiny_config(tmp_path))
    sweep = SweepConfig(
        task=("listops",), attention=("softmax", "oprf-fastfodl"), attention_features=(16,), seed=(0,)
    )
    with pytest.raises(ValueError, match=r"--attention oprf-fastfodl .*unknown attention 'oprf-fastfodl'"):
        run_sweep(sweep, settings)
    assert not (tmp_path / "out").exists()  # nothing ran


def test_sigterm_to_a_sweep_reaches_its_running_child_and_waits_for_it(tmp_path, data):
    out = tmp_path / "out"
    command = [
        sys.executable, "-m", "lra_bench", "sweep", "--task", "listops", "--attention", "softmax",
        "--attention-features", "16", "--seed", "0", "--data", str(data), "--out", str(out),
        "--device", "cpu",
        "--threads", "1", "--batch-size", "8", "--steps", "100000", "--eval-every", "100000", "--max-length",
        "32", "--dim", "16", "--embedding-dim", "16", "--hidden-dim", "16", "--log-every", "1",
    ]  # fmt: skip
    sweep = subprocess.Popen(command, env=dict(os.environ, OMP_NUM_THREADS="1"), stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not list(out.glob("runs/*/log.jsonl")):  # the child is training
        assert time.monotonic() < deadline, "the run never started"
        assert sweep.poll() is None, "the sweep exited early"
        time.sleep(0.2)
    children = [int(p) for p in Path(f"/proc/{sweep.pid}/task/{sweep.pid}/children").read_text().split()]
    runs = [pid for pid in children if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(runs) == 1  # the run (multiprocessing's resource tracker is the other child)
    sweep.send_signal(signal.SIGTERM)
    assert sweep.wait(timeout=60) == 128 + signal.SIGTERM
    for pid in runs:
        status = Path(f"/proc/{pid}/status")
        assert not status.exists() or "zombie" in status.read_text()
