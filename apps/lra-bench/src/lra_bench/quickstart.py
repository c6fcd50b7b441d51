"""``lra-bench quick`` (alias ``quickstart``): the whole pipeline in a few minutes on a CPU, no download.

1. Check the settings and every attention name (before anything is generated).
2. Generate a small ListOps set with ``lra_data`` (the LRA's rules with shorter, shallower expressions)
   under ``OUT/data`` (kept: a second call reuses it).
3. Sweep the given attentions over it (one seed), short runs with the rest of the protocol unchanged:
   early stopping on validation accuracy, the best checkpoint evaluated on test, results in
   ``OUT/results.jsonl``, checkpoints in ``OUT/runs`` (finished runs are skipped on a second call).
4. Write the report to ``OUT/report`` and return its Table 1, followed by the same attentions' time and
   memory against softmax at 1K-16K tokens (`long_sequences`: what linear attention buys) and the cost of
   one training step at the paper's ListOps setting (`step_cost`: what a run at Table 6's scale costs).
"""

from __future__ import annotations

from pathlib import Path

import lra_data
from app_common.records import RESULTS
from lra_bench.config import QuickConfig, ReportConfig, SweepConfig
from lra_bench.long_sequences import long_sequence_table
from lra_bench.report import report
from lra_bench.step_cost import listops_step_table
from lra_bench.sweep import check_attentions, grid, run_sweep


def quick(config: QuickConfig) -> str:
    """Run the quick pipeline; returns the Markdown of Table 1, the long-sequence and the step-cost tables."""
    out = Path(config.out)
    data = out / "data"
    sweep = SweepConfig(
        task=("listops",),
        attention=config.attention,
        attention_features=(config.attention_features,),
        seed=(config.seed,),
    )
    settings = {
        "data": data,
        "out": out,
        "device": config.device,
        "dtype": config.dtype,
        "threads": config.threads,
        "batch_size": config.batch_size,
        "lr": config.lr,
        "warmup_steps": config.steps // 10,
        "eval_every": max(1, config.steps // 10),
        "eval_batches": 0,
        "init_steps": 0,
        "max_length": config.max_length,
        "steps": config.steps,
        "log_every": 25,
    }
    check_attentions(grid(sweep, settings))
    if not (data / "listops" / lra_data.MANIFEST).is_file():
        manifest = lra_data.generate(
            lra_data.GenerateConfig(
                task="listops",
                n=config.train_examples,
                val=config.heldout_examples,
                test=config.heldout_examples,
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
    run_sweep(sweep, settings)
    tables = report(
        ReportConfig(
            results=out / RESULTS,
            report_dir=out / "report",
            table1_features=config.attention_features,
            time_unit="s",
        )
    )
    parts = [
        tables["table1"],
        long_sequence_table(config.attention, features=config.attention_features, repeats=config.repeats),
    ]
    if config.step_cost_steps:
        parts.append(listops_step_table(config.attention, steps=config.step_cost_steps))
    return "\n\n".join(parts)
