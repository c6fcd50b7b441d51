"""``vit-finetune sweep`` and ``quick``: the dense run and every layer kind at every k, one after another.

Finished runs are skipped (their records say so), killed ones resume (the apps' one grid policy,
`app_common.grid`); ``quick`` is the offline demo:
``vit-digits`` from random initialization on scikit-learn's digits, on the CPU in a few minutes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from app_common.fields import RaLiMPFields, RuntimeFields, group_settings
from app_common.grid import run_grid
from app_common.records import RESULTS
from vit_finetune.config import QuickConfig, ReportConfig, SweepConfig, TrainConfig, run_name
from vit_finetune.report import report
from vit_finetune.train import train


def runs_of(sweep: SweepConfig, base: TrainConfig) -> list[TrainConfig]:
    """The runs of the grid: the dense model once (with ``--attention``: at every k), each kind at each k."""
    configs = []
    for layer in sweep.layer:
        once = layer == "dense" and base.attention == "softmax"
        for k in sweep.last_k[:1] if once else sweep.last_k:
            configs.append(dataclasses.replace(base, layer=layer, last_k=k))
    return configs


def _place(config: TrainConfig) -> tuple[Path, str]:
    return config.out, run_name(config)


def run_sweep(sweep: SweepConfig, base: TrainConfig) -> list[dict]:
    """Run this shard's configurations of `runs_of` through [`run_grid`][app_common.grid.run_grid].

    Returns:
        The records of the runs finished now in this process (none with ``--isolation process``).
    """
    outcome = run_grid(
        runs_of(sweep, base), train, place=_place, grid=sweep, resume=base.resume, desc="sweep"
    )
    return [record for record in outcome.returned if record is not None]


def quick(config: QuickConfig) -> str:
    """The offline demo; returns the Markdown table (also in ``OUT/report`` with the curves)."""
    out = Path(config.out)
    base = TrainConfig(
        data="digits",
        model="vit-digits",
        epochs=config.epochs,
        features=config.features,
        init=config.init,
        replaced_lr_scale=config.replaced_lr_scale,
        attention=config.attention,
        seed=config.seed,
        **group_settings(config, RuntimeFields),
        **group_settings(config, RaLiMPFields),
        out=out,
        results=out / RESULTS,
    )
    if config.attention != "softmax":
        dense = SweepConfig(layer=("dense",), last_k=(config.last_k[0],))
        run_sweep(dense, dataclasses.replace(base, attention="softmax"))
    run_sweep(SweepConfig(layer=config.layer, last_k=config.last_k), base)
    return report(ReportConfig(results=out / RESULTS, report_dir=out / "report"))
