"""``lra-bench sweep``: every run of a grid, skipping those already finished, shardable.

The grid ``task x attention x attention_features x seed`` is enumerated in a fixed order and run by
[`app_common.grid.run_grid`][app_common.grid.run_grid], the apps' one grid policy: ``--shard i/n`` takes
runs ``i, i + n, i + 2n, ...``, a run with a record is skipped and every other run resumes its checkpoint,
and ``--isolation`` (here ``process`` by default) gives each run its own process, so that its peak memory
is its own, a crash of one run does not end the sweep, and SIGTERM sent to the sweep reaches the running
child, which is waited for.

Every attention name and option of the grid is checked before the first run starts (a typo fails at
once, not in every run).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app_common.grid import run_grid
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


def _place(config: TrainConfig) -> tuple[Path, str]:
    return config.out, run_name(config)


def run_sweep(
    sweep: SweepConfig, settings: Mapping[str, Any], table6: Mapping | None = None
) -> dict[str, list[str]]:
    """Run this shard's part of the grid through [`run_grid`][app_common.grid.run_grid].

    Returns:
        The run names that were ``done`` before, ``ran`` now and ``failed`` (with process isolation, a
        process that exited with an error; the other runs still run).

    Raises:
        ValueError: a bad setting or attention anywhere in the grid (before any run starts).
        app_common.process.Terminated: the sweep got SIGTERM (the running child got it too and was
            waited for).
    """
    everything = grid(sweep, settings, table6)
    check_attentions(everything)
    outcome = run_grid(everything, _run, place=_place, grid=sweep, desc="sweep")
    return {"done": outcome.done, "ran": outcome.ran, "failed": outcome.failed}
