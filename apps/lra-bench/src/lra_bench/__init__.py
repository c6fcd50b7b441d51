"""Train and compare any attention of ``rf_attention`` on the Long Range Arena (Spectraformer Section 4).

The command ``lra-bench`` (``train``, ``sweep``, ``report``, ``quick``/``quickstart``, ``list``) wraps
these:

    from lra_bench import train, train_config
    config = train_config({"task": "listops", "attention": "oprf-fastfoodl", "attention_features": 128})
    record = train(config)
    record["test_accuracy"]

Hyper-parameters default to Table 6 ([`TABLE_6`][lra_bench.TABLE_6]); the model is
[`LRAClassifier`][lra_bench.LRAClassifier] of a [`ModelConfig`][lra_bench.ModelConfig].
"""

from lra_bench.config import (
    TABLE_6,
    ModelConfig,
    QuickConfig,
    ReportConfig,
    SweepConfig,
    TaskHyperparameters,
    TrainConfig,
    run_name,
    table6_row,
    train_config,
)
from lra_bench.model import LRAClassifier, LRAEncoder
from lra_bench.quickstart import quick
from lra_bench.report import aggregate, report
from lra_bench.sweep import check_attentions, grid, run_sweep
from lra_bench.train import evaluate, train

__all__ = [
    "TABLE_6",
    "LRAClassifier",
    "LRAEncoder",
    "ModelConfig",
    "QuickConfig",
    "ReportConfig",
    "SweepConfig",
    "TaskHyperparameters",
    "TrainConfig",
    "aggregate",
    "check_attentions",
    "evaluate",
    "grid",
    "quick",
    "report",
    "run_name",
    "run_sweep",
    "table6_row",
    "train",
    "train_config",
]
