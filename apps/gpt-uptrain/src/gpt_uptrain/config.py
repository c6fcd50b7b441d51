"""Configurations of ``gpt-uptrain``: every field is a flag of its subcommand and a TOML key.

``batch_size`` is the flag ``--batch-size`` and the key ``batch_size`` of the file given with ``--config``;
flags win. The flags the apps share (``--device``, ``--dtype``, ``--steps``, ``--lr``, ``--eval-every``,
``--out``, ``--resume``, ...) come from ``app_common``'s field groups. The architecture is a
`GPTConfig` held in ``TrainConfig.model``; its fields are flags of ``train`` too
(``--n-layer``, ``--layer``, ``--features``, ``--seed``), TOML keys at the top level or in a ``[model]``
table.

The defaults of `TrainConfig` are the paper's GPT-2 protocol (ralimp.txt, App. "GPT-2"): GPT-2 Large
(36 blocks, width 1280, 20 heads, context 1024), AdamW (0.9, 0.95) with weight decay 0.1, learning rate
6e-4 with 500 warm-up steps and a cosine decay to 6e-5, 24 sequences x 30 accumulated micro-steps per
step, seed 1337, validation perplexity after 30k steps averaged over 200 batches; the paper's bfloat16 is
``--dtype bfloat16``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from app_common.fields import (
    EvalFields,
    OptimizerFields,
    OutputFields,
    RaLiMPFields,
    RuntimeFields,
    check_int_fields,
    group_settings,
    option,
)
from app_common.records import RESULTS
from gpt_uptrain.model import INITS, GPTConfig, has_feature_map

#: GPT-2 Large, the paper's model (its vocabulary comes from the data).
GPT2_LARGE = GPTConfig(block_size=1024, n_layer=36, n_head=20, n_embd=1280, seed=1337)

#: Where a run writes by default.
RUN = Path("runs/gpt-uptrain")


#: ``--init``: ``auto`` is ``lstsq`` for pretrained MLPs (``--weights`` a folder), ``psi`` from scratch.
STARTS = ("auto", *INITS)


@dataclass(frozen=True, kw_only=True)
class TrainConfig(RuntimeFields, OptimizerFields, EvalFields, OutputFields):
    """One run: ``gpt-uptrain train`` (from scratch, or uptraining a local HF GPT-2 with ``--weights``).

    Its identity (what ``--resume`` compares, and whose digest ends its folder's name,
    `gpt_uptrain.train.run_name`) is every setting except ``device``, ``threads``, ``log_every``, ``out``,
    ``resume``, ``results``, ``name``, ``compile`` and ``memory_check``. ``data`` stays in it: no other
    setting says which data set the token folder holds.
    """

    MAY_CHANGE_ON_RESUME: ClassVar[tuple[str, ...]] = ("results", "name", "compile", "memory_check")
    #: ``model.attention_window`` and ``model.attention_input_map`` came after runs were recorded: at 0 and
    #: False they keep their names and resume.
    ADDED_SETTINGS: ClassVar[Mapping[str, Any]] = {"attention_window": 0, "attention_input_map": False}

    data: Path = field(
        default=Path("data/openwebtext"), metadata={"help": "folder with train.bin, val.bin, meta.json"}
    )
    out: Path = option("out", RUN)
    results: Path = option("results", Path("results/gpt-uptrain.jsonl"))
    name: str | None = field(
        default=None, metadata={"help": "label of the run in the results (default: its MLP kind)"}
    )
    weights: str = option("weights", "scratch", help="'scratch', or a local Hugging Face GPT-2 folder")
    transfer_steps: int = field(
        default=0,
        metadata={
            "help": "attention transfer steps before fine-tuning: only the RF feature maps train, to match "
            "softmax layer by layer (makes them learnable)"
        },
    )
    transfer_lr: float = field(default=1e-2, metadata={"help": "AdamW learning rate of attention transfer"})
    model: GPTConfig = field(default=GPT2_LARGE)
    init: str = option("init", "auto", choices=STARTS)
    # Optimization.
    batch_size: int = field(default=24, metadata={"help": "sequences per micro-step (per process)"})
    gradient_accumulation_steps: int = field(
        default=30, metadata={"help": "micro-steps per optimizer step, over all processes together"}
    )
    steps: int = option("steps", 30_000, help="the fixed budget")
    lr: float = option("lr", 6e-4, help="AdamW")
    min_lr: float = field(default=6e-5, metadata={"help": "learning rate at the end of the cosine"})
    warmup_steps: int = option("warmup_steps", 500)
    lr_decay_steps: int | None = field(
        default=None, metadata={"help": "end of the cosine (default: --steps)"}
    )
    weight_decay: float = option("weight_decay", 0.1)
    beta1: float = field(default=0.9, metadata={"help": "AdamW beta1"})
    beta2: float = field(default=0.95, metadata={"help": "AdamW beta2"})
    # Evaluation and bookkeeping.
    eval_every: int = option("eval_every", 1000, help="a checkpoint follows each")
    eval_batches: int = option("eval_batches", 200, help="validation batches, the same every time")
    compile: bool = field(default=False, metadata={"help": "torch.compile the model"})
    memory_check: bool = field(
        default=True,
        metadata={"help": "refuse at start a run whose estimated training memory exceeds the device's"},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.model, GPTConfig):
            raise ValueError(f"model: expected a GPTConfig, got {type(self.model).__name__}")
        check_int_fields(self, "batch_size", "gradient_accumulation_steps", "eval_every", "eval_batches")
        check_int_fields(self, "warmup_steps", "transfer_steps", minimum=0)
        if self.transfer_steps and not has_feature_map(self.model.attention):
            raise ValueError(
                "--transfer-steps: attention transfer needs an --attention with a feature map "
                f"('<component>-<matrix>', 'hedgehog', 't2r'), got {self.model.attention!r}"
            )
        if not 0 < self.min_lr <= self.lr:
            raise ValueError(f"--min-lr: expected 0 < min_lr <= lr={self.lr}, got {self.min_lr}")
        if self.lr_decay_steps is not None and self.lr_decay_steps <= self.warmup_steps:
            raise ValueError(
                f"--lr-decay-steps: expected more than warmup_steps={self.warmup_steps}, "
                f"got {self.lr_decay_steps}"
            )
        if self.init not in STARTS:
            raise ValueError(f"--init: expected one of {', '.join(STARTS)}, got {self.init!r}")

    @property
    def start(self) -> str:
        """``init`` with ``auto`` resolved: ``lstsq`` for pretrained MLPs, ``psi`` from scratch."""
        if self.init != "auto":
            return self.init
        return "psi" if self.weights == "scratch" else "lstsq"

    @property
    def seed(self) -> int:
        """The run's seed (``--seed``): the weights, the random features and the batches; ``model.seed``."""
        return self.model.seed

    def model_config(self, vocab_size: int) -> GPTConfig:
        """The `GPTConfig` of a run: ``model`` with the data's vocabulary (learnable maps for a transfer)."""
        learnable = self.model.learnable_attention or self.transfer_steps > 0
        return dataclasses.replace(self.model, vocab_size=vocab_size, learnable_attention=learnable)

    @property
    def label(self) -> str:
        """The run's name in tables: ``name``, else the MLP kind (with k and a non-softmax attention)."""
        if self.name:
            return self.name
        m = self.model
        label = m.layer if m.layer == "dense" else f"{m.layer} (k={m.last_k if m.last_k else 'half'})"
        return label if m.attention == "softmax" else f"{label} + {m.attention}"


@dataclass(frozen=True)
class PrepareConfig:
    """``gpt-uptrain prepare FILES... --out DIR``: tokenize local text files into train.bin/val.bin/meta.json.

    Without files: the quick corpus (Python's standard library sources, see ``stdlib_max_chars``).
    """

    files: tuple[Path, ...] = field(
        default=(), metadata={"help": "UTF-8 text files (none: the stdlib corpus)"}
    )
    data: Path = field(default=Path("data/stdlib-char"), metadata={"help": "folder the token files go to"})
    tokenizer: str = field(default="char", metadata={"help": "char, byte or gpt2 (BPE via tiktoken)"})
    val_fraction: float = field(
        default=0.1, metadata={"help": "share of the tokens held out (the last ones)"}
    )
    stdlib_max_chars: int = field(default=1_000_000, metadata={"help": "size of the stdlib corpus"})


#: The run settings of ``quick``: the paper's protocol scaled down to a CPU (same optimizer, schedule
#: shape and evaluation rule): a 4-block character model, 12 x 2 sequences of 64 tokens per step.
QUICK_RUN = TrainConfig(
    model=GPTConfig(block_size=64, n_layer=4, n_head=4, n_embd=128, last_k=2, seed=1337),
    batch_size=12,
    gradient_accumulation_steps=2,
    steps=300,
    warmup_steps=15,
    lr=1e-3,
    min_lr=1e-4,
    eval_every=50,
    eval_batches=20,
    log_every=5,
    threads=1,
)


@dataclass(frozen=True, kw_only=True)
class QuickConfig(RuntimeFields, OptimizerFields, OutputFields, RaLiMPFields):
    """``gpt-uptrain quick``: a small character-level GPT on the stdlib corpus, dense and each replacement.

    The runs are `QUICK_RUN` with the flags given here (the warm-up stays 5% of ``--steps``, the
    final rate ``lr / 10``).
    """

    out: Path = option("out", Path("runs/gpt-uptrain-quick"), help="and of data/ and report/")
    layer: tuple[str, ...] = option(
        "layer", ("dense", "ralimp", "eugen", "snnk"), help="several values: a run each"
    )
    corpus_chars: int = field(default=1_000_000, metadata={"help": "characters of stdlib source"})
    steps: int = option("steps", QUICK_RUN.steps)
    lr: float = option("lr", QUICK_RUN.lr)
    threads: int = option("threads", 1, help="the models are small: more threads only contend")
    last_k: int = option("last_k", QUICK_RUN.model.last_k, help="of the 4 blocks")
    features: int = option("features", QUICK_RUN.model.features)
    attention: str = option("attention", "softmax", help="every block's, used causally")
    init: str = option("init", "auto", choices=STARTS)
    seed: int = option("seed", QUICK_RUN.seed)

    def run(self, layer: str, data: Path) -> TrainConfig:
        """The `TrainConfig` of the run of MLP kind ``layer`` on the corpus in ``data``."""
        model = dataclasses.replace(
            QUICK_RUN.model,
            layer=layer,
            last_k=self.last_k,
            features=self.features,
            attention=self.attention,
            seed=self.seed,
            **group_settings(self, RaLiMPFields),
        )
        return dataclasses.replace(
            QUICK_RUN,
            data=data,
            out=Path(self.out),
            results=Path(self.out) / RESULTS,
            name=layer if layer == "dense" else f"{layer} (last {self.last_k})",
            resume=self.resume,
            model=model,
            init=self.init,
            steps=self.steps,
            warmup_steps=max(1, round(0.05 * self.steps)),
            lr=self.lr,
            min_lr=self.lr / 10,
            grad_clip=self.grad_clip,
            device=self.device,
            dtype=self.dtype,
            threads=self.threads,
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
    attention: str | None = option(
        "attention", None, help="HF folders only, causal (default softmax; checkpoints bring theirs)"
    )
    tokenizer: str = field(
        default="gpt2", metadata={"help": "HF folders only: the tokenizer (checkpoints bring theirs)"}
    )
    seed: int = option("seed", 1337, help="here: the sampling's (and an HF model's RF attention's)")
    device: str = option("device", "auto", metavar="auto|cpu|cuda[:i]")

    def __post_init__(self) -> None:
        check_int_fields(self, "num_samples", "max_new_tokens")
        if self.top_k is not None:
            check_int_fields(self, "top_k")


@dataclass(frozen=True)
class ReportConfig:
    """``gpt-uptrain report RESULTS``: the Markdown/CSV table of validation perplexity and the loss curves."""

    results: Path = field(metadata={"help": "JSON-lines results of train/quick"})
    report_dir: Path | None = option("report_dir", None)
