"""``lra-bench quickstart``: the whole pipeline in a few minutes on a CPU, with no download.

1. Generate a small ListOps set with ``lra_data`` (the LRA's rules with shorter, shallower expressions)
   under ``OUT/data`` (kept: a second call reuses it).
2. Sweep the given attentions over it (one seed), short runs with the rest of the protocol unchanged:
   early stopping on validation accuracy, the best checkpoint evaluated on test, results in
   ``OUT/results.jsonl``, checkpoints in ``OUT/runs`` (finished runs are skipped on a second call).
3. Write the report to ``OUT/report`` and return its Table 1.
"""

from __future__ import annotations

from pathlib import Path

import lra_data
from lra_bench.config import QuickstartConfig, ReportConfig, SweepConfig
from lra_bench.report import report
from lra_bench.sweep import run_sweep


def quickstart(config: QuickstartConfig) -> str:
    """Run the quickstart; returns the Markdown of Table 1."""
    out = Path(config.out)
    data = out / "data"
    if not (data / "listops" / lra_data.MANIFEST).is_file():
        manifest = lra_data.generate(
            lra_data.GenerateConfig(
                task="listops",
                n=config.train_examples,
                val=config.eval_examples,
                test=config.eval_examples,
                out=data,
                seed=config.seed,
                listops=lra_data.ListOpsConfig(
                    max_depth=config.max_depth,
                    max_args=config.max_args,
                    min_length=4,
                    max_length=config.max_length,
                ),
            )
        )
        counts = {split: entry["count"] for split, entry in manifest["splits"].items()}
        print(f"generated ListOps at {data / 'listops'}: {counts}")
    results = out / "results.jsonl"
    run_sweep(
        SweepConfig(
            tasks=("listops",),
            attentions=config.attentions,
            features=(config.features,),
            seeds=(config.seed,),
        ),
        {
            "data": data,
            "results": results,
            "runs": out / "runs",
            "device": config.device,
            "threads": config.threads,
            "batch_size": config.batch_size,
            "learning_rate": config.learning_rate,
            "warmup_steps": config.max_steps // 10,
            "eval_frequency": max(1, config.max_steps // 10),
            "eval_steps": 0,
            "init_steps": 0,
            "max_length": config.max_length,
            "max_steps": config.max_steps,
            "log_every": 25,
        },
    )
    tables = report(
        ReportConfig(results=results, out=out / "report", table1_features=config.features, time_unit="s")
    )
    return tables["table1"]
