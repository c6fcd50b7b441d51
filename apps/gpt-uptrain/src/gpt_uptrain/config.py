"""Configurations of ``gpt-uptrain``: every field is a flag of its subcommand and a TOML key.

``batch_size`` is the flag ``--batch-size`` and the key ``batch_size`` of the file given with ``--config``;
flags win.

The defaults of [`TrainConfig`][gpt_uptrain.TrainConfig] are the paper's GPT-2 protocol (ralimp.txt, App.
"GPT-2"): GPT-2 Large (36 blocks, width 1280, 20 heads, context 1024), AdamW (0.9, 0.95) with weight decay
0.1, learning rate 6e-4 with 500 warm-up iterations and a cosine decay to 6e-5, 24 sequences x 30 accumulated
micro-steps per iteration, bfloat16 autocast on CUDA, seed 1337, validation perplexity after 30k iterations
averaged over 200 batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from app_common import DEVICES

PRECISIONS = ("auto", "float32", "bfloat16")


def _positive(config, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class TrainConfig:
    """One run: ``gpt-uptrain train`` (from scratch, or uptraining a local HF GPT-2 with ``--init-from``)."""

    data: Path = field(
        default=Path("data/openwebtext"), metadata={"help": "folder with train.bin, val.bin, meta.json"}
    )
    out: Path = field(
        default=Path("runs/gpt-uptrain/run"), metadata={"help": "run folder: checkpoint.pt, log.jsonl"}
    )
    results: Path = field(
        default=Path("results/gpt-uptrain.jsonl"),
        metadata={"help": "JSON-lines file the final record goes to"},
    )
    name: str | None = field(
        default=None, metadata={"help": "label of the run in the results (default: its MLP kind)"}
    )
    init_from: str = field(
        default="scratch", metadata={"help": "'scratch', or a local Hugging Face GPT-2 folder to uptrain"}
    )
    resume: bool = field(default=False, metadata={"help": "continue from OUT/checkpoint.pt if there is one"})
    # Model (the shape fields apply to --init-from scratch; a pretrained folder brings its own).
    n_layer: int = field(default=36, metadata={"help": "blocks"})
    n_head: int = field(default=20, metadata={"help": "attention heads"})
    n_embd: int = field(default=1280, metadata={"help": "width"})
    block_size: int = field(default=1024, metadata={"help": "context length (crops a pretrained one)"})
    dropout: float = field(default=0.0, metadata={"help": "dropout rate"})
    bias: bool = field(default=True, metadata={"help": "biases in linear layers and LayerNorms"})
    attention: str = field(
        default="softmax", metadata={"help": "any causal rf_attention name, e.g. oprf-orf"}
    )
    attention_features: int = field(default=128, metadata={"help": "random features of an RF attention"})
    mlp: str = field(default="dense", metadata={"help": "dense, ralimp, eugen, snnk or lowrank"})
    last_k: int | None = field(
        default=None, metadata={"help": "replace the MLPs of the last k blocks (None: half)"}
    )
    mlp_features: int = field(default=128, metadata={"help": "feature budget of the replacement"})
    mlp_weight_matrix: str = field(default="base", metadata={"help": "rf_matrices name of its projections"})
    # Optimization.
    batch_size: int = field(default=24, metadata={"help": "sequences per micro-step (per process)"})
    gradient_accumulation_steps: int = field(
        default=30, metadata={"help": "micro-steps per iteration, over all processes together"}
    )
    max_iters: int = field(default=30_000, metadata={"help": "iterations: the fixed budget"})
    learning_rate: float = field(default=6e-4, metadata={"help": "peak AdamW learning rate"})
    min_lr: float = field(default=6e-5, metadata={"help": "learning rate at the end of the cosine"})
    warmup_iters: int = field(default=500, metadata={"help": "linear warm-up iterations"})
    lr_decay_iters: int | None = field(default=None, metadata={"help": "end of the cosine (None: max_iters)"})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW weight decay (matrices only)"})
    beta1: float = field(default=0.9, metadata={"help": "AdamW beta1"})
    beta2: float = field(default=0.95, metadata={"help": "AdamW beta2"})
    grad_clip: float = field(default=1.0, metadata={"help": "clip the gradient norm; 0: off"})
    # Evaluation and bookkeeping.
    eval_interval: int = field(
        default=1000, metadata={"help": "iterations between evaluations + checkpoints"}
    )
    eval_iters: int = field(
        default=200, metadata={"help": "validation batches averaged (the same ones every time)"}
    )
    log_interval: int = field(default=10, metadata={"help": "iterations between training-loss log lines"})
    seed: int = field(default=1337, metadata={"help": "seed of the weights, random features and batches"})
    device: str = field(
        default="auto", metadata={"help": "auto: CUDA if available", "metavar": "|".join(DEVICES)}
    )
    dtype: str = field(
        default="auto",
        metadata={
            "help": "autocast precision; auto: bfloat16 on CUDA, float32 on CPU",
            "choices": PRECISIONS,
        },
    )
    compile: bool = field(default=False, metadata={"help": "torch.compile the model"})
    threads: int = field(default=0, metadata={"help": "CPU threads of torch (0: torch's default)"})

    def __post_init__(self) -> None:
        _positive(
            self,
            "batch_size",
            "gradient_accumulation_steps",
            "max_iters",
            "eval_interval",
            "eval_iters",
            "log_interval",
        )
        if self.warmup_iters < 0:
            raise ValueError(f"warmup_iters: expected an integer >= 0, got {self.warmup_iters}")
        if not 0 < self.min_lr <= self.learning_rate:
            raise ValueError(
                f"min_lr: expected 0 < min_lr <= learning_rate={self.learning_rate}, got {self.min_lr}"
            )
        if self.lr_decay_iters is not None and self.lr_decay_iters <= self.warmup_iters:
            raise ValueError(
                f"lr_decay_iters: expected more than warmup_iters={self.warmup_iters}, "
                f"got {self.lr_decay_iters}"
            )
        if self.dtype not in PRECISIONS:
            raise ValueError(f"dtype: expected one of {', '.join(PRECISIONS)}, got {self.dtype!r}")

    @property
    def label(self) -> str:
        """The run's name in tables: ``name``, else the MLP kind (with k and a non-softmax attention)."""
        if self.name:
            return self.name
        label = (
            self.mlp if self.mlp == "dense" else f"{self.mlp} (k={self.last_k if self.last_k else 'half'})"
        )
        return label if self.attention == "softmax" else f"{label} + {self.attention}"


@dataclass(frozen=True)
class PrepareConfig:
    """``gpt-uptrain prepare FILES... --out DIR``: tokenize local text files into train.bin/val.bin/meta.json.

    Without files: the quick corpus (Python's standard library sources, see ``stdlib_max_chars``).
    """

    files: tuple[Path, ...] = field(
        default=(), metadata={"help": "UTF-8 text files (none: the stdlib corpus)"}
    )
    out: Path = field(default=Path("data/stdlib-char"), metadata={"help": "output data folder"})
    tokenizer: str = field(default="char", metadata={"help": "char, byte or gpt2 (BPE via tiktoken)"})
    val_fraction: float = field(
        default=0.1, metadata={"help": "share of the tokens held out (the last ones)"}
    )
    stdlib_max_chars: int = field(default=1_000_000, metadata={"help": "size of the stdlib corpus"})


@dataclass(frozen=True)
class QuickConfig:
    """``gpt-uptrain quick``: a small character-level GPT on the stdlib corpus, dense and each replacement.

    The paper's protocol scaled down to a CPU: same optimizer, schedule shape and evaluation rule.
    """

    out: Path = field(
        default=Path("runs/gpt-uptrain-quick"), metadata={"help": "folder of data, runs, report"}
    )
    kinds: tuple[str, ...] = field(
        default=("dense", "ralimp", "eugen", "snnk"), metadata={"help": "MLP kinds"}
    )
    last_k: int = field(default=2, metadata={"help": "replaced blocks (of n_layer)"})
    corpus_chars: int = field(default=1_000_000, metadata={"help": "characters of stdlib source"})
    n_layer: int = field(default=4, metadata={"help": "blocks"})
    n_head: int = field(default=4, metadata={"help": "heads"})
    n_embd: int = field(default=128, metadata={"help": "width"})
    block_size: int = field(default=64, metadata={"help": "context"})
    batch_size: int = field(default=12, metadata={"help": "sequences per micro-step"})
    gradient_accumulation_steps: int = field(default=2, metadata={"help": "micro-steps per iteration"})
    max_iters: int = field(default=300, metadata={"help": "iterations per model (the fixed budget)"})
    warmup_iters: int = field(default=15, metadata={"help": "warm-up iterations"})
    learning_rate: float = field(default=1e-3, metadata={"help": "peak learning rate"})
    min_lr: float = field(default=1e-4, metadata={"help": "final learning rate"})
    eval_interval: int = field(default=50, metadata={"help": "iterations between evaluations"})
    eval_iters: int = field(default=20, metadata={"help": "validation batches averaged"})
    mlp_features: int = field(default=128, metadata={"help": "feature budget of the replacements"})
    attention: str = field(default="softmax", metadata={"help": "rf_attention name for every model"})
    seed: int = field(default=1337, metadata={"help": "seed"})
    device: str = field(default="auto", metadata={"help": "auto: CUDA if available"})
    threads: int = field(
        default=1, metadata={"help": "CPU threads of torch: the models are small; more threads only contend"}
    )


@dataclass(frozen=True)
class SampleConfig:
    """``gpt-uptrain sample CHECKPOINT``: text from a run's checkpoint.pt or a local HF GPT-2 folder."""

    checkpoint: Path = field(metadata={"help": "a checkpoint.pt of train/quick, or an HF GPT-2 folder"})
    prompt: str = field(default="\n", metadata={"help": "text to continue"})
    num_samples: int = field(default=1, metadata={"help": "samples"})
    max_new_tokens: int = field(default=200, metadata={"help": "tokens per sample"})
    temperature: float = field(default=0.8, metadata={"help": "softmax temperature"})
    top_k: int | None = field(default=200, metadata={"help": "sample among the k likeliest tokens"})
    attention: str | None = field(
        default=None,
        metadata={"help": "HF folders only: run with this causal rf_attention (default softmax)"},
    )
    tokenizer: str = field(
        default="gpt2", metadata={"help": "HF folders only: the tokenizer (checkpoints bring theirs)"}
    )
    seed: int = field(default=1337, metadata={"help": "sampling seed"})
    device: str = field(default="auto", metadata={"help": "auto: CUDA if available"})

    def __post_init__(self) -> None:
        _positive(self, "num_samples", "max_new_tokens")
        if self.top_k is not None:
            _positive(self, "top_k")


@dataclass(frozen=True)
class ReportConfig:
    """``gpt-uptrain report RESULTS``: the Markdown/CSV table of validation perplexity and the loss curves."""

    results: Path = field(metadata={"help": "JSON-lines results of train/quick"})
    out: Path | None = field(default=None, metadata={"help": "output folder (default: beside RESULTS)"})
