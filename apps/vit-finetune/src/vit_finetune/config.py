"""Configurations of ``vit-finetune``: every field is a flag (``last_k`` is ``--last-k``) and a TOML key.

The flags the apps share (``--device``, ``--steps``, ``--lr``, ``--layer``, ``--features``, ``--attention``,
``--out``, ``--resume``, ...) come from ``app_common``'s field groups and mean the same as in every app.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from app_common import fields
from app_common.fields import (
    AttentionFields,
    EvalFields,
    LayerFields,
    OutputFields,
    RaLiMPFields,
    RuntimeFields,
    check_int_fields,
    option,
    run_identity,
)
from app_common.grid import GridFields
from vit_finetune.data import DATASETS

#: How a replaced MLP starts: ``lstsq`` (readout fitted to the pretrained MLP on a training batch),
#: ``psi`` (the paper's ``Psi(W)``), ``auto`` (``lstsq`` for pretrained MLPs, ``psi`` for a random model).
INITS = ("auto", "lstsq", "psi")

#: Where the run folders go by default.
RUNS = Path("runs/vit-finetune")


@dataclass(frozen=True, kw_only=True)
class TrainConfig(
    RuntimeFields,
    EvalFields,
    LayerFields,
    RaLiMPFields,
    AttentionFields,
    OutputFields,
):
    """One fine-tuning run: ``vit-finetune train``.

    The protocol of the RaLiMP paper's ViT experiments: the MLPs of the last ``k`` blocks replaced
    (initialized from the pretrained ones), the whole network fine-tuned with cross-entropy, AdamW, a
    one-cycle schedule (10% linear warm-up, cosine annealing to 0), gradient-norm clipping at 1.0, float32,
    seed 0. Fields left at None take the data set's defaults (``vit_finetune.data.DATASETS``). The run's
    folder is ``OUT/<data>-<model>-<layer>-k<k>-s<seed>-<digest of its identity>``.
    """

    #: Settings that do not change what a run computes (with the groups' own: device, threads, log_every,
    #: out, resume): left out of its identity, free to change on resume.
    MAY_CHANGE_ON_RESUME: ClassVar[tuple[str, ...]] = (
        "data_path",
        "weights",
        "workers",
        "results",
        "throughput_batch",
        "throughput_repeats",
    )

    data: str = field(default="digits", metadata={"help": "data set", "choices": tuple(DATASETS.names())})
    data_path: Path | None = field(default=None, metadata={"help": "data folder (not needed for digits)"})
    model: str | None = field(
        default=None, metadata={"help": "model name (vit-finetune list models); default: the data set's"}
    )
    weights: Path | None = option(
        "weights", None, help="a local checkpoint file/folder (timm or HF); default: the hub when online"
    )
    weight_matrix: str | None = option(
        "weight_matrix",
        None,
        help="default: the layer's own",
    )
    init: str = option("init", "auto", choices=INITS)
    last_k: int = option("last_k", 4, help="and swap their --attention")
    attention: str = option(
        "attention",
        "softmax",
        help="of the same blocks (softmax: keep the model's)",
    )
    seed: int = option("seed", 0)
    tune: bool = field(
        default=False, metadata={"help": "train on train, evaluate on val (else train+val, evaluate on test)"}
    )
    image_size: int | None = field(default=None, metadata={"help": "input side; default: the model's"})
    batch_size: int | None = field(default=None, metadata={"help": "batch size; default: the data set's"})
    lr: float | None = option("lr", None, help="AdamW; default: the data set's")
    epochs: int | None = field(default=None, metadata={"help": "epochs; default: the data set's"})
    # The optimizer flags of OptimizerFields, whose steps may not be None (here: the data set's epochs).
    steps: int | None = option("steps", None, help="wins over --epochs")
    grad_clip: float = option("grad_clip", 1.0)
    warmup_steps: int | None = option("warmup_steps", None, help="default: a tenth of the steps (at least 1)")
    weight_decay: float = option("weight_decay", 0.05)
    replaced_lr_scale: float = field(
        default=1.0,
        metadata={
            "help": "learning-rate factor of the replaced layers (RaLiMP's W enters Psi(W) through exp)"
        },
    )
    dropout: float = option("dropout", 0.0)
    augment: bool = field(default=False, metadata={"help": "random flips and padded crops in training"})
    eval_every: int | None = option("eval_every", None, help="default: an epoch")
    throughput_batch: int = field(default=64, metadata={"help": "batch of the inference-throughput timing"})
    throughput_repeats: int = field(default=10, metadata={"help": "timed forward passes per model and round"})
    workers: int = option("workers", 0)
    out: Path = option("out", RUNS)
    results: Path = option("results", Path("results/vit-finetune.jsonl"))

    def __post_init__(self) -> None:
        super().__post_init__()
        DATASETS.get(self.data)
        check_int_fields(self, "last_k", "throughput_batch", "throughput_repeats")
        given = [n for n in ("batch_size", "epochs", "image_size", "steps") if getattr(self, n) is not None]
        check_int_fields(self, *given)
        check_int_fields(self, "workers", minimum=0)
        if self.init not in INITS:
            raise ValueError(f"--init: expected one of {', '.join(INITS)}, got {self.init!r}")
        if not self.replaced_lr_scale > 0:
            raise ValueError(f"--replaced-lr-scale: expected a factor > 0, got {self.replaced_lr_scale}")
        if self.warmup_steps is not None:
            check_int_fields(self, "warmup_steps", minimum=0)
        if not 0 <= self.dropout < 1:
            raise ValueError(f"--dropout: expected a rate in [0, 1), got {self.dropout}")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"--lr: expected a rate > 0, got {self.lr}")
        if self.grad_clip < 0:
            raise ValueError(f"--grad-clip: expected a norm >= 0 (0: off), got {self.grad_clip}")
        if self.weight_decay < 0:
            raise ValueError(f"--weight-decay: expected a value >= 0, got {self.weight_decay}")

    def resolved(self) -> TrainConfig:
        """This configuration with the data set's defaults filled in where a field is None."""
        spec = DATASETS.get(self.data)
        defaults = {"model": spec.model, "batch_size": spec.batch_size, "lr": spec.lr, "epochs": spec.epochs}
        return dataclasses.replace(self, **{k: v for k, v in defaults.items() if getattr(self, k) is None})


def run_label(config: TrainConfig) -> str:
    """``digits-vit-digits-ralimp-k4-s0``: the head of the run's name (the data set's defaults filled in)."""
    config = config.resolved()
    attention = "" if config.attention == "softmax" else f"-{config.attention}"
    model = config.model.replace("/", "_")
    return f"{config.data}-{model}-{config.layer}-k{config.last_k}{attention}-s{config.seed}"


def run_name(config: TrainConfig) -> str:
    """``digits-vit-digits-ralimp-k4-s0-1a2b3c4d``: `run_label` and a digest of the run's identity.

    The apps' one scheme ([`app_common.fields.run_name`][app_common.fields.run_name]).
    """
    return fields.run_name(run_label(config), run_identity(config.resolved()))


@dataclass(frozen=True, kw_only=True)
class SweepConfig(GridFields):
    """``vit-finetune sweep``: the dense model and every layer kind at every k, on one data set.

    Every flag of ``vit-finetune train`` is accepted too and applies to every run; ``--shard`` and
    ``--isolation`` (in-process by default) are the apps' one grid policy.
    """

    layer: tuple[str, ...] = option(
        "layer", ("dense", "ralimp", "snnk", "eugen"), help="several values: a grid"
    )
    last_k: tuple[int, ...] = option("last_k", (4, 7, 9, 11), help="several values: a grid (dense runs once)")


@dataclass(frozen=True, kw_only=True)
class QuickConfig(RuntimeFields, RaLiMPFields):
    """``vit-finetune quick``: the offline demo (a small random-init ViT on scikit-learn's digits, CPU)."""

    out: Path = option("out", Path("runs/vit-finetune-quick"), help="and of report/")
    layer: tuple[str, ...] = option(
        "layer", ("dense", "ralimp", "snnk", "eugen"), help="several values: a grid"
    )
    last_k: tuple[int, ...] = option("last_k", (4,), help="several values: a grid")
    epochs: int = field(default=40, metadata={"help": "epochs per run"})
    replaced_lr_scale: float = field(
        default=0.1, metadata={"help": "learning-rate factor of the replaced layers (all kinds alike)"}
    )
    features: int = option("features", 32)
    init: str = option("init", "auto", choices=INITS)
    attention: str = option("attention", "softmax", help="of the same blocks (softmax: keep the model's)")
    seed: int = option("seed", 0)


@dataclass(frozen=True)
class ReportConfig:
    """``vit-finetune report RESULTS``: Markdown/CSV table and PNG plots of a results file."""

    results: Path = field(metadata={"help": "JSON-lines results of train/sweep/quick"})
    report_dir: Path | None = option("report_dir", None)
