"""Configurations of ``vit-finetune``: every field is a flag (``last_k`` is ``--last-k``) and a TOML key."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from app_common import DEVICES, DTYPES, config_dict
from vit_finetune.data import DATASETS


@dataclass(frozen=True)
class TrainConfig:
    """One fine-tuning run: ``vit-finetune train``.

    The protocol of the RaLiMP paper's ViT experiments: the MLPs of the last ``k`` blocks replaced
    (initialized from the pretrained ones), the whole network fine-tuned with cross-entropy, AdamW, a
    one-cycle schedule (10% linear warm-up, cosine annealing to 0), gradient-norm clipping at 1.0, float32,
    seed 0. Fields left at None take the data set's defaults (`vit_finetune.data.DATASETS`).
    """

    data: str = field(default="digits", metadata={"help": "data set", "choices": tuple(DATASETS.names())})
    data_path: Path | None = field(default=None, metadata={"help": "data folder (not needed for digits)"})
    model: str | None = field(
        default=None, metadata={"help": "model name (vit-finetune models); None: the data set's"}
    )
    weights: Path | None = field(
        default=None,
        metadata={"help": "local checkpoint file/folder (timm or HF); None: the hub when online"},
    )
    layer: str = field(
        default="ralimp", metadata={"help": "dense, or the ralimp layer kind replacing the MLPs"}
    )
    last_k: int = field(
        default=4, metadata={"help": "replace the MLPs (and --attention) of the last k blocks"}
    )
    features: int = field(default=32, metadata={"help": "random-feature budget of each replaced MLP"})
    layer_options: str = field(
        default="{}",
        metadata={"help": 'JSON object of more layer options, e.g. \'{"weight_matrix": "orf"}\''},
    )
    attention: str | None = field(
        default=None, metadata={"help": "swap the attention of the same blocks for this rf_attention name"}
    )
    attention_features: int = field(default=128, metadata={"help": "random features of --attention"})
    seed: int = field(default=0, metadata={"help": "seed of the data order, augmentation, random features"})
    tune: bool = field(
        default=False, metadata={"help": "train on train, evaluate on val (else train+val, evaluate on test)"}
    )
    image_size: int | None = field(default=None, metadata={"help": "input side; None: the model's"})
    batch_size: int | None = field(default=None, metadata={"help": "batch size; None: the data set's"})
    learning_rate: float | None = field(
        default=None, metadata={"help": "peak AdamW rate; None: the data set's"}
    )
    epochs: int | None = field(default=None, metadata={"help": "epochs; None: the data set's"})
    max_steps: int | None = field(default=None, metadata={"help": "optimizer steps (wins over --epochs)"})
    warmup: float = field(default=0.1, metadata={"help": "fraction of the steps in linear warm-up"})
    weight_decay: float = field(
        default=0.05, metadata={"help": "AdamW weight decay (not on biases, norms, embeddings)"}
    )
    replaced_lr_scale: float = field(
        default=1.0,
        metadata={
            "help": "learning-rate factor of the replaced layers (RaLiMP's W enters Psi(W) through exp)"
        },
    )
    grad_clip: float = field(default=1.0, metadata={"help": "clip the gradient norm to this; 0: off"})
    dropout: float = field(default=0.0, metadata={"help": "dropout in the blocks"})
    augment: bool = field(default=False, metadata={"help": "random flips and padded crops in training"})
    eval_every: int = field(default=0, metadata={"help": "steps between evaluations (0: every epoch)"})
    log_every: int = field(default=10, metadata={"help": "steps between training-loss log lines"})
    throughput_batch: int = field(default=64, metadata={"help": "batch of the inference-throughput timing"})
    throughput_repeats: int = field(default=10, metadata={"help": "timed forward passes per model and round"})
    device: str = field(
        default="auto", metadata={"help": "auto: CUDA if available", "metavar": "|".join(DEVICES)}
    )
    dtype: str = field(default="float32", metadata={"help": "autocast precision", "choices": tuple(DTYPES)})
    workers: int = field(default=0, metadata={"help": "DataLoader worker processes"})
    runs: Path = field(
        default=Path("runs/vit-finetune"), metadata={"help": "folder of run checkpoints and logs"}
    )
    results: Path = field(
        default=Path("results/vit-finetune.jsonl"), metadata={"help": "JSON-lines file the result goes to"}
    )
    resume: bool = field(
        default=True, metadata={"help": "continue from the run's checkpoint if there is one"}
    )

    def __post_init__(self) -> None:
        DATASETS.get(self.data)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {self.dtype!r}")
        for name in (
            "last_k",
            "features",
            "attention_features",
            "log_every",
            "throughput_batch",
            "throughput_repeats",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {getattr(self, name)}")
        for name in ("batch_size", "epochs", "max_steps", "image_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}: expected an integer >= 1 or None, got {value}")
        if self.learning_rate is not None and not self.learning_rate > 0:
            raise ValueError(f"learning_rate: expected a rate > 0, got {self.learning_rate}")
        if not self.replaced_lr_scale > 0:
            raise ValueError(f"replaced_lr_scale: expected a factor > 0, got {self.replaced_lr_scale}")
        if not 0 <= self.warmup < 1:
            raise ValueError(f"warmup: expected a fraction in [0, 1), got {self.warmup}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout: expected a rate in [0, 1), got {self.dropout}")
        if self.grad_clip < 0 or self.weight_decay < 0 or self.eval_every < 0:
            raise ValueError("grad_clip, weight_decay, eval_every: expected values >= 0")
        options = self.options()
        if not isinstance(options, dict):
            raise ValueError(f"layer_options: expected a JSON object, got {self.layer_options!r}")

    def options(self) -> dict:
        """``layer_options`` parsed."""
        try:
            return json.loads(self.layer_options)
        except json.JSONDecodeError as error:
            raise ValueError(f"layer_options: not valid JSON ({error.msg}): {self.layer_options!r}") from None

    def resolved(self) -> TrainConfig:
        """This configuration with the data set's defaults filled in where a field is None."""
        spec = DATASETS.get(self.data)
        defaults = {
            "model": spec.model,
            "batch_size": spec.batch_size,
            "learning_rate": spec.learning_rate,
            "epochs": spec.epochs,
        }
        return dataclasses.replace(self, **{k: v for k, v in defaults.items() if getattr(self, k) is None})


#: Fields that do not change what a run computes: left out of its identity.
NOT_IDENTITY = (
    "data_path",
    "weights",
    "device",
    "workers",
    "runs",
    "results",
    "resume",
    "log_every",
    "throughput_batch",
    "throughput_repeats",
)


def run_name(config: TrainConfig) -> str:
    """``digits-vit-digits-ralimp-k4-s0-1a2b3c4d``: the run's folder, from every setting that changes it."""
    config = config.resolved()
    settings = {k: v for k, v in config_dict(config).items() if k not in NOT_IDENTITY}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]
    attention = f"-{config.attention}" if config.attention else ""
    model = config.model.replace("/", "_")
    return f"{config.data}-{model}-{config.layer}-k{config.last_k}{attention}-s{config.seed}-{digest}"


@dataclass(frozen=True)
class SweepConfig:
    """``vit-finetune sweep``: the dense model and every layer kind at every k, on one data set.

    Every flag of ``vit-finetune train`` is accepted too and applies to every run.
    """

    layers: tuple[str, ...] = field(
        default=("dense", "ralimp", "snnk", "eugen"), metadata={"help": "layer kinds"}
    )
    ks: tuple[int, ...] = field(default=(4, 7, 9, 11), metadata={"help": "values of k (dense runs once)"})


@dataclass(frozen=True)
class QuickConfig:
    """``vit-finetune quick``: the offline demo (a small random-init ViT on scikit-learn's digits, CPU)."""

    out: Path = field(
        default=Path("runs/vit-finetune-quick"), metadata={"help": "folder of runs, results, report"}
    )
    layers: tuple[str, ...] = field(
        default=("dense", "ralimp", "snnk", "eugen"), metadata={"help": "layer kinds"}
    )
    ks: tuple[int, ...] = field(default=(4,), metadata={"help": "values of k"})
    epochs: int = field(default=40, metadata={"help": "epochs per run"})
    replaced_lr_scale: float = field(
        default=0.1, metadata={"help": "learning-rate factor of the replaced layers (all kinds alike)"}
    )
    features: int = field(default=32, metadata={"help": "random-feature budget"})
    attention: str | None = field(
        default=None, metadata={"help": "also swap the attention (rf_attention name)"}
    )
    seed: int = field(default=0, metadata={"help": "seed"})
    device: str = field(default="auto", metadata={"help": "auto: CUDA if available"})


@dataclass(frozen=True)
class ReportConfig:
    """``vit-finetune report RESULTS``: Markdown/CSV table and PNG plots of a results file."""

    results: Path = field(metadata={"help": "JSON-lines results of train/sweep/quick"})
    out: Path | None = field(default=None, metadata={"help": "output folder; None: RESULTS' folder/report"})
