"""Configurations of ``lra-bench``: the hyper-parameters of Spectraformer Table 6 and every run setting.

Each frozen dataclass maps one to one onto the flags of a subcommand (``batch_size`` is ``--batch-size``)
and onto the keys of a TOML file (``--config FILE``). Precedence, later winning: Table 6 (per task), a
``[table6.<task>]`` table of the TOML file, the TOML file's top-level keys, the command-line flags.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lra_data
from app_common import DEVICES, DTYPES, config_dict


@dataclass(frozen=True)
class TaskHyperparameters:
    """The per-task rows of Table 6.

    Attributes:
        batch_size: examples per optimizer step (the global batch under DDP).
        learning_rate: peak learning rate of AdamW.
        warmup_steps: steps of linear warm-up from 0 to the peak.
        eval_frequency: steps between evaluations on the validation split.
        eval_steps: validation batches per evaluation (the first ``eval_steps`` batches, the same each
            time; 0 = the whole split).
        init_steps: steps before early stopping may stop the run (Table 6's "Num. init steps").
        max_length: tokens kept per document (Retrieval: per each of its two documents).
    """

    batch_size: int
    learning_rate: float
    warmup_steps: int
    eval_frequency: int
    eval_steps: int
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

#: Fields that do not change what a run computes: left out of the run's identity (`run_name`).
NOT_IDENTITY = ("data", "results", "runs", "resume", "device", "compile", "workers", "threads", "log_every")


@dataclass(frozen=True)
class TrainConfig:
    """One training run: ``lra-bench train`` (every field is a flag, ``--batch-size`` for ``batch_size``).

    The model rows of Table 6 are the defaults; per-task rows left at None come from
    [`TABLE_6`][lra_bench.TABLE_6] when the run starts ([`resolved`][lra_bench.TrainConfig.resolved]).
    """

    task: str = field(metadata={"help": "LRA task", "choices": lra_data.TASKS})
    attention: str = field(default="softmax", metadata={"help": "any name of rf_attention.names()"})
    features: int = field(default=128, metadata={"help": "random features (rows of the weight matrix)"})
    seed: int = field(default=0, metadata={"help": "seed of the weights, random features, data order"})
    data: Path = field(default=Path("data/lra"), metadata={"help": "cache root of lra-data (DATA/TASK)"})
    results: Path = field(
        default=Path("results/lra-bench.jsonl"), metadata={"help": "JSON-lines file the result goes to"}
    )
    runs: Path = field(
        default=Path("runs/lra-bench"), metadata={"help": "folder of the runs' checkpoints and logs"}
    )
    resume: bool = field(default=False, metadata={"help": "continue from the run's checkpoint if any"})
    device: str = field(
        default="auto", metadata={"help": "auto: CUDA if available", "metavar": "|".join(DEVICES)}
    )
    dtype: str = field(default="float32", metadata={"help": "autocast precision", "choices": tuple(DTYPES)})
    compile: bool = field(default=False, metadata={"help": "torch.compile the model"})
    workers: int = field(default=0, metadata={"help": "DataLoader worker processes"})
    threads: int = field(default=0, metadata={"help": "CPU threads of torch (0: torch's default)"})
    # Model (Table 6, the same for every task).
    embedding_dim: int = field(default=64, metadata={"help": "token and position embedding width"})
    dim: int = field(default=64, metadata={"help": "transformer width"})
    hidden_dim: int = field(default=128, metadata={"help": "feed-forward and classifier hidden width"})
    num_heads: int = field(default=2, metadata={"help": "attention heads (head dim = dim / heads)"})
    num_layers: int = field(default=2, metadata={"help": "transformer blocks"})
    dropout: float = field(default=0.1, metadata={"help": "dropout rate"})
    attention_dropout: float = field(
        default=0.1, metadata={"help": "dropout on attention probabilities (attentions that have them)"}
    )
    # Training (Table 6, per task when None).
    batch_size: int | None = field(default=None, metadata={"help": "global batch; None: Table 6"})
    learning_rate: float | None = field(default=None, metadata={"help": "peak AdamW rate; None: Table 6"})
    warmup_steps: int | None = field(default=None, metadata={"help": "linear warm-up steps; None: Table 6"})
    eval_frequency: int | None = field(default=None, metadata={"help": "steps between evaluations"})
    eval_steps: int | None = field(default=None, metadata={"help": "validation batches (0: whole split)"})
    init_steps: int | None = field(default=None, metadata={"help": "steps before early stopping may stop"})
    max_length: int | None = field(default=None, metadata={"help": "tokens kept per document"})
    max_steps: int = field(default=50_000, metadata={"help": "step budget (linear decay ends here)"})
    patience: int = field(default=10, metadata={"help": "evaluations without improvement before stopping"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    grad_clip: float = field(default=1.0, metadata={"help": "clip gradient values to [-c, c]; 0: off"})
    log_every: int = field(default=50, metadata={"help": "steps between training-loss log lines"})

    def __post_init__(self) -> None:
        if self.task not in lra_data.TASKS:
            raise ValueError(f"task: unknown {self.task!r}; expected one of {', '.join(lra_data.TASKS)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {self.dtype!r}")
        positive = ("features", "dim", "embedding_dim", "hidden_dim", "num_heads", "num_layers", "max_steps")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {getattr(self, name)}")
        if self.dim % self.num_heads:
            raise ValueError(f"num_heads: expected a divisor of dim={self.dim}, got {self.num_heads}")
        for name in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name}: expected a rate in [0, 1), got {getattr(self, name)}")
        if self.patience < 1:
            raise ValueError(f"patience: expected an integer >= 1, got {self.patience}")

    def resolved(self, table6: Mapping[str, Mapping[str, Any]] | None = None) -> TrainConfig:
        """This configuration with every per-task field that is None taken from Table 6.

        Args:
            table6: per-task overrides of Table 6 (``{"listops": {"batch_size": 8}}``, a TOML file's
                ``[table6.listops]`` table).

        Raises:
            ValueError: an override that is no field of
                [`TaskHyperparameters`][lra_bench.TaskHyperparameters].
        """
        row = dataclasses.asdict(TABLE_6[self.task])
        overrides = dict((table6 or {}).get(self.task, {}))
        unknown = set(overrides) - set(row)
        if unknown:
            raise ValueError(
                f"table6.{self.task}: unknown {', '.join(sorted(unknown))}; expected {', '.join(row)}"
            )
        row.update(overrides)
        config = dataclasses.replace(self, **{k: v for k, v in row.items() if getattr(self, k) is None})
        for name in TASK_FIELDS:
            value = getattr(config, name)
            if name == "learning_rate":
                if value <= 0:
                    raise ValueError(f"learning_rate: expected a rate > 0, got {value}")
                continue
            low = 0 if name in ("warmup_steps", "eval_steps", "init_steps") else 1
            if value < low:
                raise ValueError(f"{name}: expected an integer >= {low}, got {value}")
        return config


def run_name(config: TrainConfig) -> str:
    """The run's identity: task, attention, features, seed and a digest of the other settings.

    The digest covers every setting that changes the result (not the paths, device, ``compile``,
    workers or logging), after Table 6 is filled in.

    ``listops-oprf-fastfoodl-f128-s0-3f2a9c1e``: its checkpoint folder, and the key by which a sweep
    knows a run is done.
    """
    if any(getattr(config, k) is None for k in TASK_FIELDS):
        config = config.resolved()
    settings = {k: v for k, v in config_dict(config).items() if k not in NOT_IDENTITY}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]
    return f"{config.task}-{config.attention}-f{config.features}-s{config.seed}-{digest}"


@dataclass(frozen=True)
class SweepConfig:
    """The grid of ``lra-bench sweep``: tasks x attentions x feature counts x seeds.

    Every other flag of ``lra-bench train`` is accepted too and applies to every run.
    """

    tasks: tuple[str, ...] = field(default=lra_data.TASKS, metadata={"help": "tasks"})
    attentions: tuple[str, ...] = field(
        default=("softmax", "performer", "oprf-fastfoodl"), metadata={"help": "attention names"}
    )
    features: tuple[int, ...] = field(default=(64, 128, 256, 512), metadata={"help": "feature counts"})
    seeds: tuple[int, ...] = field(default=(0, 1, 2, 3, 4), metadata={"help": "seeds"})
    shard: str = field(default="0/1", metadata={"help": "i/n: run the i-th of n interleaved parts"})

    def __post_init__(self) -> None:
        unknown = [t for t in self.tasks if t not in lra_data.TASKS]
        if unknown:
            raise ValueError(
                f"tasks: unknown {', '.join(unknown)}; expected some of {', '.join(lra_data.TASKS)}"
            )
        self.shard_index()

    def shard_index(self) -> tuple[int, int]:
        """``(i, n)`` of ``shard = "i/n"``.

        Raises:
            ValueError: not two integers with 0 <= i < n.
        """
        try:
            i, n = (int(part) for part in self.shard.split("/"))
        except ValueError:
            raise ValueError(f"shard: expected 'i/n' with integers, got {self.shard!r}") from None
        if not 0 <= i < n:
            raise ValueError(f"shard: expected 0 <= i < n, got {self.shard!r}")
        return i, n


@dataclass(frozen=True)
class ReportConfig:
    """What ``lra-bench report RESULTS`` writes: Tables 1, 7, 8 (Markdown and CSV) and Figure 4 (PNG)."""

    results: Path = field(metadata={"help": "JSON-lines results file of train/sweep"})
    out: Path | None = field(default=None, metadata={"help": "output folder; None: RESULTS' folder/report"})
    table1_features: int = field(default=128, metadata={"help": "feature count of the Table 1 rows"})
    time_unit: str = field(
        default="h", metadata={"help": "unit of training time", "choices": ("s", "min", "h")}
    )


@dataclass(frozen=True)
class QuickstartConfig:
    """``lra-bench quickstart``: a small generated ListOps set, a few attentions, the report table."""

    out: Path = field(default=Path("runs/quickstart"), metadata={"help": "folder of data, runs and report"})
    attentions: tuple[str, ...] = field(
        default=("softmax", "performer", "oprf-fastfoodl"), metadata={"help": "attentions to train"}
    )
    train_examples: int = field(default=4000, metadata={"help": "generated training expressions"})
    eval_examples: int = field(default=500, metadata={"help": "generated validation and test expressions"})
    max_depth: int = field(default=4, metadata={"help": "ListOps tree depth"})
    max_args: int = field(default=4, metadata={"help": "ListOps arguments per operator"})
    max_length: int = field(default=100, metadata={"help": "longest generated expression (tokens)"})
    features: int = field(default=64, metadata={"help": "random features"})
    max_steps: int = field(default=1000, metadata={"help": "steps per attention"})
    batch_size: int = field(default=32, metadata={"help": "batch size"})
    learning_rate: float = field(default=1e-3, metadata={"help": "peak learning rate"})
    seed: int = field(default=0, metadata={"help": "seed"})
    device: str = field(default="auto", metadata={"help": "auto: CUDA if available"})
    threads: int = field(
        default=1, metadata={"help": "CPU threads of torch: the models are tiny; more threads only contend"}
    )
