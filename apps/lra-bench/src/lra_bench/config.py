"""Configurations of ``lra-bench``: the hyper-parameters of Spectraformer Table 6 and every run setting.

Each frozen dataclass maps one to one onto the flags of a subcommand (``batch_size`` is ``--batch-size``)
and onto the keys of a TOML file (``--config FILE``); the flags shared with the other apps (``--device``,
``--steps``, ``--lr``, ``--attention``, ...) come from ``app_common``'s field groups. Precedence, later
winning: Table 6 (per task), a ``[table6.<task>]`` table of the TOML file, the TOML file's top-level keys,
the command-line flags.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import lra_data
from app_common import fields
from app_common.config import config_from
from app_common.fields import (
    AttentionFields,
    EvalFields,
    OptimizerFields,
    OutputFields,
    RuntimeFields,
    check_int_fields,
    option,
    run_identity,
)
from app_common.grid import GridFields
from spectraformer_core import check_int


@dataclass(frozen=True)
class TaskHyperparameters:
    """The per-task rows of Table 6.

    Attributes:
        batch_size: examples per optimizer step (the global batch under DDP).
        lr: peak learning rate of AdamW.
        warmup_steps: steps of linear warm-up from 0 to the peak.
        eval_every: steps between evaluations on the validation split.
        eval_batches: validation batches per evaluation (the first ``eval_batches`` batches, the same each
            time; 0 = the whole split).
        init_steps: steps before early stopping may stop the run (Table 6's "Num. init steps").
        max_length: tokens kept per document (Retrieval: per each of its two documents).
    """

    batch_size: int
    lr: float
    warmup_steps: int
    eval_every: int
    eval_batches: int
    init_steps: int
    max_length: int


TABLE_6: dict[str, TaskHyperparameters] = {
    "listops": TaskHyperparameters(32, 1e-4, 1000, 500, 62, 1000, 2000),
    "text": TaskHyperparameters(32, 1e-4, 80, 500, 200, 3000, 4000),
    "retrieval": TaskHyperparameters(16, 2e-4, 800, 1000, 300, 3000, 4000),
    "image": TaskHyperparameters(256, 1e-4, 175, 50, 20, 0, 1024),
    "pathfinder": TaskHyperparameters(128, 2e-4, 312, 500, 156, 3500, 1024),
}
"""Task -> its row of Table 6 (Retrieval's sequence length 8000 is two documents of 4000)."""

TASK_FIELDS = tuple(f.name for f in dataclasses.fields(TaskHyperparameters))


def table6_row(task: str, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Table 6's row of ``task`` with the overrides of a TOML file's ``[table6.<task>]`` table applied.

    Raises:
        ValueError: an unknown task, or an override that is no field of
            [`TaskHyperparameters`][lra_bench.TaskHyperparameters].
    """
    if task not in TABLE_6:
        raise ValueError(f"--task: unknown {task!r}; expected one of {', '.join(lra_data.TASKS)}")
    row = dataclasses.asdict(TABLE_6[task])
    given = dict((overrides or {}).get(task, {}))
    unknown = set(given) - set(row)
    if unknown:
        raise ValueError(f"table6.{task}: unknown {', '.join(sorted(unknown))}; expected {', '.join(row)}")
    return {**row, **given}


@dataclass(frozen=True, kw_only=True)
class ModelConfig(AttentionFields):
    """The encoder of Table 6 (the same for every task) and its attention."""

    embedding_dim: int = field(default=64, metadata={"help": "token and position embedding width"})
    dim: int = field(default=64, metadata={"help": "transformer width"})
    hidden_dim: int = field(default=128, metadata={"help": "feed-forward and classifier hidden width"})
    num_heads: int = field(default=2, metadata={"help": "attention heads (head dim = dim / heads)"})
    num_layers: int = field(default=2, metadata={"help": "transformer blocks"})
    dropout: float = option("dropout", 0.1)
    attention_dropout: float = field(
        default=0.1, metadata={"help": "dropout on attention probabilities (attentions that have them)"}
    )

    def __post_init__(self) -> None:
        """Widths and counts >= 1, heads dividing the width, rates in [0, 1)."""
        super().__post_init__()
        check_int_fields(self, "dim", "embedding_dim", "hidden_dim", "num_heads", "num_layers")
        if self.dim % self.num_heads:
            raise ValueError(f"--num-heads: expected a divisor of dim={self.dim}, got {self.num_heads}")
        for name in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(
                    f"--{name.replace('_', '-')}: expected a rate in [0, 1), got {getattr(self, name)}"
                )


@dataclass(frozen=True, kw_only=True)
class TrainConfig(RuntimeFields, OptimizerFields, EvalFields, OutputFields):
    """One training run: ``lra-bench train``.

    Per-task fields left at None (batch size, lr, warm-up, eval every, eval steps, init steps, max length)
    are filled from Table 6 when the configuration is made. The run's identity (its folder name and what
    a resumed checkpoint must match) is every setting except data, out, resume, device, threads,
    compile, workers and log_every.
    """

    MAY_CHANGE_ON_RESUME: ClassVar[tuple[str, ...]] = ("data", "compile", "workers")

    task: str = field(metadata={"help": "LRA task", "choices": lra_data.TASKS})
    seed: int = option("seed", 0)
    data: Path = field(default=Path("data/lra"), metadata={"help": "cache root of lra-data (DATA/TASK)"})
    out: Path = option("out", Path("results/lra-bench"))
    compile: bool = field(default=False, metadata={"help": "torch.compile the model"})
    workers: int = option("workers", 0)
    model: ModelConfig = field(default_factory=ModelConfig)
    # Training (Table 6, per task when None).
    steps: int = option("steps", 50_000, help="linear decay")
    lr: float | None = option("lr", None, help="AdamW; None: Table 6")
    grad_clip: float = option("grad_clip", 1.0)
    eval_every: int | None = option("eval_every", None, help="None: Table 6")
    log_every: int = option("log_every", 50)
    batch_size: int | None = field(default=None, metadata={"help": "global batch; None: Table 6"})
    warmup_steps: int | None = option("warmup_steps", None, help="None: Table 6")
    eval_batches: int | None = option(
        "eval_batches", None, help="the first ones of the validation split (0: all of it); None: Table 6"
    )
    init_steps: int | None = field(
        default=None, metadata={"help": "steps before early stopping may stop; None: Table 6"}
    )
    max_length: int | None = field(default=None, metadata={"help": "tokens kept per document; None: Table 6"})
    patience: int = field(default=10, metadata={"help": "evaluations without improvement before stopping"})
    weight_decay: float = option("weight_decay", 0.0)

    def __post_init__(self) -> None:
        """Fill the per-task fields left at None from Table 6, then check every value."""
        row = table6_row(self.task)
        for name in TASK_FIELDS:
            if getattr(self, name) is None:
                object.__setattr__(self, name, row[name])
        super().__post_init__()
        check_int_fields(self, "batch_size", "max_length", "patience")
        check_int_fields(self, "warmup_steps", "eval_batches", "init_steps", "workers", minimum=0)


def train_config(
    settings: Mapping[str, Any], table6: Mapping[str, Mapping[str, Any]] | None = None
) -> TrainConfig:
    """A [`TrainConfig`][lra_bench.TrainConfig] from flat settings, Table 6 overrides under them.

    Args:
        settings: field values by name (the model's fields flat, as their flags), ``task`` among them;
            None values are left to Table 6.
        table6: a TOML file's ``[table6.<task>]`` tables.

    Raises:
        ValueError: no task, or an unknown Table 6 override.
    """
    if settings.get("task") is None:
        raise ValueError(f"--task: required, one of {', '.join(lra_data.TASKS)}")
    task = settings["task"]
    table6_row(task, table6)  # unknown overrides fail here
    given = {k: v for k, v in settings.items() if v is not None}
    return config_from(TrainConfig, {**(table6 or {}).get(task, {}), **given})


def run_label(config: TrainConfig) -> str:
    """``listops-oprf-fastfoodl-f128-s0``: task, attention, features and seed, the head of the run's name."""
    model = config.model
    return f"{config.task}-{model.attention}-f{model.attention_features}-s{config.seed}"


def run_name(config: TrainConfig) -> str:
    """``listops-oprf-fastfoodl-f128-s0-3f2a9c1e``: `run_label` and a digest of the run's identity.

    The apps' one scheme ([`app_common.fields.run_name`][app_common.fields.run_name]): its checkpoint
    folder, and the key by which a sweep knows a run is done. The digest covers
    [`app_common.fields.run_identity`][app_common.fields.run_identity] (Table 6 filled in).
    """
    return fields.run_name(run_label(config), run_identity(config))


#: Fields of the grid of ``lra-bench sweep`` (each takes several values there).
GRID = ("task", "attention", "attention_features", "seed")


@dataclass(frozen=True, kw_only=True)
class SweepConfig(GridFields):
    """The grid of ``lra-bench sweep``: task x attention x attention features x seed.

    Each grid flag is the ``train`` flag of the same name, taking several values; every other flag of
    ``lra-bench train`` is accepted too and applies to every run. Every attention name and option is
    checked before the first run starts.
    """

    task: tuple[str, ...] = field(
        default=lra_data.TASKS, metadata={"help": "tasks", "choices": lra_data.TASKS}
    )
    attention: tuple[str, ...] = option(
        "attention", ("softmax", "performer", "oprf-fastfoodl"), help="several values: a grid"
    )
    attention_features: tuple[int, ...] = option(
        "attention_features", (64, 128, 256, 512), help="several values: a grid"
    )
    seed: tuple[int, ...] = option("seed", (0, 1, 2, 3, 4), help="several values: a grid")
    isolation: str = option("isolation", "process", help="default: process (a run's peak memory is its own)")

    def __post_init__(self) -> None:
        super().__post_init__()
        unknown = [t for t in self.task if t not in lra_data.TASKS]
        if unknown:
            raise ValueError(
                f"--task: unknown {', '.join(unknown)}; expected some of {', '.join(lra_data.TASKS)}"
            )


@dataclass(frozen=True)
class ReportConfig:
    """What ``lra-bench report RESULTS`` writes: Tables 1, 7, 8 (Markdown and CSV) and Figure 4 (PNG)."""

    results: Path = field(metadata={"help": "JSON-lines results file of train/sweep"})
    report_dir: Path | None = option("report_dir", None)
    table1_features: int | None = field(
        default=None,
        metadata={
            "help": "attention features of the Table 1 rows (default: the paper's 128 when the results have "
            "it, else the largest count they have)"
        },
    )
    time_unit: str = field(
        default="h", metadata={"help": "unit of training time", "choices": ("s", "min", "h")}
    )


@dataclass(frozen=True, kw_only=True)
class QuickConfig(RuntimeFields):
    """``lra-bench quick`` (alias ``quickstart``): generated ListOps, a few attentions, Table 1."""

    out: Path = option("out", Path("runs/quickstart"), help="and of data/ and report/")
    attention: tuple[str, ...] = option(
        "attention", ("softmax", "performer", "oprf-fastfoodl"), help="several values: one run each"
    )
    train_examples: int = field(default=4000, metadata={"help": "generated training expressions"})
    heldout_examples: int = field(
        default=500, metadata={"help": "generated validation and test expressions (each)"}
    )
    max_depth: int = field(default=4, metadata={"help": "ListOps tree depth"})
    max_args: int = field(default=4, metadata={"help": "ListOps arguments per operator"})
    max_length: int = field(default=100, metadata={"help": "longest generated expression (tokens)"})
    attention_features: int = option("attention_features", 64)
    steps: int = option("steps", 1000, help="steps per attention")
    batch_size: int = field(default=32, metadata={"help": "batch size"})
    lr: float = option("lr", 1e-3)
    seed: int = option("seed", 0)
    threads: int = option("threads", 1, help="the models are tiny: more threads only contend")
    repeats: int = field(default=3, metadata={"help": "runs per point of the long-sequence table (medians)"})
    step_cost_steps: int = field(
        default=1,
        metadata={"help": "timed training steps per attention at Table 6's ListOps setting (0: no table)"},
    )

    def __post_init__(self) -> None:
        """Every count >= 1 (``step_cost_steps`` >= 0; checked before any data is generated)."""
        super().__post_init__()
        check_int("step_cost_steps", self.step_cost_steps, minimum=0)
        check_int_fields(
            self,
            "repeats",
            "train_examples",
            "heldout_examples",
            "max_depth",
            "max_args",
            "max_length",
            "attention_features",
            "steps",
            "batch_size",
        )
        if not self.lr > 0:
            raise ValueError(f"--lr: expected a number > 0, got {self.lr!r}")
