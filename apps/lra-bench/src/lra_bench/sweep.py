"""``lra-bench sweep``: every run of a grid, each in a fresh process, skipping those already in the results.

The grid ``task x attention x attention_features x seed`` is enumerated in a fixed order; shard ``i/n``
takes runs ``i, i + n, i + 2n, ...`` so ``n`` machines (or GPUs) split it without talking to each other.
A run is done when the results file holds a line with its [`run_name`][lra_bench.run_name]; every other
run resumes its checkpoint, so re-running the same command after a crash continues where it stopped.

Every attention name and option of the grid is checked before the first run starts (a typo fails at
once, not in every run). Each run gets its own process ([`app_common.run_child`][app_common.run_child]): its
peak memory
(on the CPU the peak RSS, which a process cannot reset) is its own, a crash of one run does not end the
sweep, and SIGTERM sent to the sweep reaches the running child, which is waited for.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import app_common as ac
from lra_bench.config import SweepConfig, TrainConfig, run_name, train_config
from lra_bench.model import create_attention


def grid(sweep: SweepConfig, settings: Mapping[str, Any], table6: Mapping | None = None) -> list[TrainConfig]:
    """The run configurations of the whole grid, in order (before sharding).

    Args:
        sweep: the grid.
        settings: values of the other [`TrainConfig`][lra_bench.TrainConfig] fields (flat), the same
            for every run.
        table6: per-task overrides of Table 6 (a TOML file's ``[table6.<task>]`` tables).
    """
    return [
        train_config(
            {**settings, "task": task, "attention": attention, "attention_features": features, "seed": seed},
            table6,
        )
        for task, attention, features, seed in itertools.product(
            sweep.task, sweep.attention, sweep.attention_features, sweep.seed
        )
    ]


def check_attentions(configs: list[TrainConfig]) -> None:
    """Build each distinct attention of ``configs`` once, so that a bad name or option fails now.

    Raises:
        ValueError: naming the attention and what is wrong with it.
    """
    for model in {config.model for config in configs}:
        try:
            create_attention(model, seed=0)
        except (ValueError, TypeError) as error:
            raise ValueError(
                f"--attention {model.attention} (attention_features={model.attention_features}): {error}"
            ) from None


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

    Raises:
        ValueError: a bad setting or attention anywhere in the grid (before any run starts).
        app_common.Terminated: the sweep got SIGTERM (the running child got it too and was waited for).
    """
    index, count = sweep.shard_index()
    everything = grid(sweep, settings, table6)
    check_attentions(everything)
    runs = everything[index::count]
    outcome: dict[str, list[str]] = {"done": [], "ran": [], "failed": []}
    if not runs:
        return outcome
    for config in ac.progress(runs, desc=f"sweep {sweep.shard}", unit="run"):
        name = run_name(config)
        if ac.finished_record(config.out, name) is not None:
            outcome["done"].append(name)
            continue
        exitcode = ac.run_child(_run, config, name=name)
        outcome["ran" if exitcode == 0 else "failed"].append(name)
        if exitcode != 0:
            print(f"{name}: failed (exit code {exitcode}); the sweep goes on")
    print(
        f"sweep {sweep.shard}: {len(runs)} runs, {len(outcome['done'])} already done, {len(outcome['ran'])} "
        f"ran now, {len(outcome['failed'])} failed"
    )
    return outcome
