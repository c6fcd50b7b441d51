"""Train and compare any attention of ``rf_attention`` on the Long Range Arena (Spectraformer Section 4).

The command ``lra-bench`` (``train``, ``sweep``, ``report``, ``quickstart``) wraps these:

    from lra_bench import TrainConfig, train
    record = train(TrainConfig(task="listops", attention="oprf-fastfoodl", features=128, data="data/lra"))
    record["test_accuracy"]

Hyper-parameters default to Table 6 ([`TABLE_6`][lra_bench.TABLE_6]); the model is
[`LRAClassifier`][lra_bench.LRAClassifier].
"""

from lra_bench.config import (
    TABLE_6,
    QuickstartConfig,
    ReportConfig,
    SweepConfig,
    TaskHyperparameters,
    TrainConfig,
    run_name,
)
from lra_bench.model import LRAClassifier, LRAEncoder
from lra_bench.quickstart import quickstart
from lra_bench.report import aggregate, report
from lra_bench.sweep import grid, run_sweep
from lra_bench.train import StepBatches, evaluate, train

__all__ = [
    "TABLE_6",
    "LRAClassifier",
    "LRAEncoder",
    "QuickstartConfig",
    "ReportConfig",
    "StepBatches",
    "SweepConfig",
    "TaskHyperparameters",
    "TrainConfig",
    "aggregate",
    "evaluate",
    "grid",
    "quickstart",
    "report",
    "run_name",
    "run_sweep",
    "train",
]
