"""``lra-bench sweep``: every run of a grid, each in a fresh process, skipping those already in the results.

The grid ``tasks x attentions x features x seeds`` is enumerated in a fixed order; shard ``i/n`` takes runs
``i, i + n, i + 2n, ...`` so ``n`` machines (or GPUs) split it without talking to each other. A run is done
when the results file holds a line with its [`run_name`][lra_bench.run_name]; every other run starts
with ``resume=True``, so re-running the same command after a crash continues where it stopped.

Each run gets its own process: its peak memory (on the CPU the peak RSS, which a process cannot reset) is
its own, and a crash of one run does not end the sweep.
"""

from __future__ import annotations

import itertools
import multiprocessing
from collections.abc import Mapping
from typing import Any

import app_common as ac
from lra_bench.config import SweepConfig, TrainConfig, run_name


def grid(sweep: SweepConfig, settings: Mapping[str, Any], table6: Mapping | None = None) -> list[TrainConfig]:
    """The resolved run configurations of the whole grid, in order (before sharding).

    Args:
        sweep: the grid.
        settings: values of the other [`TrainConfig`][lra_bench.TrainConfig] fields, the same for every run.
        table6: per-task overrides of Table 6 (see [`TrainConfig.resolved`][lra_bench.TrainConfig.resolved]).
    """
    return [
        TrainConfig(
            task=task, attention=attention, features=features, seed=seed, **{**settings, "resume": True}
        ).resolved(table6)
        for task, attention, features, seed in itertools.product(
            sweep.tasks, sweep.attentions, sweep.features, sweep.seeds
        )
    ]


def _run(config: TrainConfig) -> None:
    from lra_bench.train import train

    train(config)


def run_sweep(
    sweep: SweepConfig, settings: Mapping[str, Any], table6: Mapping | None = None
) -> dict[str, list[str]]:
    """Run this shard's part of the grid, each run in its own process.

    Returns:
        The run names that were ``done`` before, ``ran`` now and ``failed`` (a process that exited with
        an error; the other runs still run).
    """
    index, count = sweep.shard_index()
    runs = grid(sweep, settings, table6)[index::count]
    outcome: dict[str, list[str]] = {"done": [], "ran": [], "failed": []}
    if not runs:
        return outcome
    results = runs[0].results
    finished = {record.get("run") for record in ac.read_jsonl(results, missing_ok=True)}
    context = multiprocessing.get_context("spawn")
    for config in ac.progress(runs, desc=f"sweep {sweep.shard}", unit="run"):
        name = run_name(config)
        if name in finished:
            outcome["done"].append(name)
            continue
        process = context.Process(target=_run, args=(config,), name=name)
        process.start()
        process.join()
        outcome["ran" if process.exitcode == 0 else "failed"].append(name)
        if process.exitcode != 0:
            print(f"{name}: failed (exit code {process.exitcode}); the sweep goes on")
    print(
        f"sweep {sweep.shard}: {len(runs)} runs, {len(outcome['done'])} already done, {len(outcome['ran'])} "
        f"ran now, {len(outcome['failed'])} failed"
    )
    return outcome
