"""Configurations of ``layer-fit``: frozen dataclasses whose fields are the command-line flags, one to one."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

#: The activations of the paper's Fig. 2.
ACTIVATIONS = ("gelu", "silu", "tanh", "sigmoid", "softsign")
#: The four methods of Fig. 2, and RaLiMP with a trainable ``Psi`` (``layer_fit.METHODS`` also holds
#: ``linear``, a rank-``r`` linear map).
PAPER_METHODS = ("lowrank", "eugen", "snnk", "ralimp", "ralimp-psi")
#: The budget sweep of the issue.
SWEEP_BUDGETS = (16, 32, 64, 128, 256)


@dataclass(frozen=True)
class FitConfig:
    """The synthetic single-layer fit (RaLiMP paper, Fig. 2): every activation x method x budget x seed.

    Defaults are the paper's protocol: W (256 x 256) and X (8192 x 256) i.i.d. Unif[0, 1], the
    pre-activation centered by its mean, X and Y = f(X W^T) standardized per column, full-batch Adam at
    lr 1e-2 with cosine decay and gradient clipping at 10 for 3000 steps, 10 seeds, train MSE reported.
    Finished runs found in the results file are skipped; a killed run resumes from its checkpoint.
    """

    activations: tuple[str, ...] = field(
        default=ACTIVATIONS, metadata={"help": "target activations f", "metavar": "NAME"}
    )
    methods: tuple[str, ...] = field(
        default=PAPER_METHODS,
        metadata={"help": "methods (lowrank, eugen, snnk, ralimp, ralimp-psi, linear)", "metavar": "NAME"},
    )
    budgets: tuple[int, ...] = field(
        default=(32,), metadata={"help": "random features / rank per method (the sweep: 16 32 64 128 256)"}
    )
    seeds: int = field(
        default=10, metadata={"help": "number of seeds per run (first_seed, first_seed+1, ...)"}
    )
    first_seed: int = field(default=0, metadata={"help": "the first seed"})
    steps: int = field(default=3000, metadata={"help": "Adam steps (full batch)"})
    lr: float = field(default=1e-2, metadata={"help": "peak learning rate (cosine decay to 0)"})
    clip: float = field(default=10.0, metadata={"help": "gradient-norm clipping threshold"})
    samples: int = field(default=8192, metadata={"help": "rows of X"})
    dim: int = field(default=256, metadata={"help": "input and output width (W is dim x dim)"})
    data_seed: int = field(default=0, metadata={"help": "seed of W and X (fixed across runs)"})
    center: str = field(
        default="column",
        metadata={
            "help": "centering of the pre-activation: 'column' (each unit by its mean) or 'global'",
            "choices": ("column", "global"),
        },
    )
    output_affine: bool = field(
        default=True,
        metadata={
            "help": "follow every method by a per-column scale and shift (the targets are standardized)"
        },
    )
    device: str = field(default="auto", metadata={"help": "auto, cpu, cuda or cuda:<i>"})
    threads: int = field(default=0, metadata={"help": "torch CPU threads (0: leave torch's default)"})
    out: Path = field(
        default=Path("results/layer-fit"),
        metadata={"help": "folder of results.jsonl, checkpoints/ and the report"},
    )
    checkpoint_every: int = field(
        default=500, metadata={"help": "save a resumable checkpoint every this many steps (0: never)"}
    )
    log_every: int = field(default=50, metadata={"help": "record the training loss every this many steps"})

    def __post_init__(self) -> None:
        for name in ("seeds", "steps", "samples", "dim", "log_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        for name in ("first_seed", "data_seed", "checkpoint_every", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: expected an integer >= 0, got {value!r}")
        if not self.lr > 0 or not self.clip > 0:
            raise ValueError(f"lr, clip: expected positive numbers, got lr={self.lr!r}, clip={self.clip!r}")
        for name in ("activations", "methods", "budgets"):
            if not getattr(self, name):
                raise ValueError(f"{name}: expected at least one value")
        if any(b < 1 for b in self.budgets):
            raise ValueError(f"budgets: expected positive integers, got {self.budgets!r}")

    def protocol(self) -> dict:
        """The settings two runs must share for their MSEs to be comparable (and a finished run reused)."""
        return {
            "steps": self.steps,
            "lr": self.lr,
            "clip": self.clip,
            "samples": self.samples,
            "dim": self.dim,
            "data_seed": self.data_seed,
            "center": self.center,
            "output_affine": self.output_affine,
        }


@dataclass(frozen=True)
class QuickConfig(FitConfig):
    """A reduced protocol that runs in under two minutes on two CPU cores, then prints the report.

    Every activation and method at budget 32, but 512 x 64 data, 200 steps, 2 seeds, one CPU thread: a
    check of the whole pipeline (data, training, results, tables, plots), not the paper's measurement.
    """

    steps: int = field(default=200, metadata={"help": "Adam steps (full batch)"})
    seeds: int = field(default=2, metadata={"help": "number of seeds per run"})
    samples: int = field(default=512, metadata={"help": "rows of X"})
    dim: int = field(default=64, metadata={"help": "input and output width (W is dim x dim)"})
    threads: int = field(default=1, metadata={"help": "torch CPU threads (0: leave torch's default)"})
    checkpoint_every: int = field(default=0, metadata={"help": "checkpoint every this many steps (0: never)"})
    out: Path = field(
        default=Path("results/layer-fit-quick"),
        metadata={"help": "folder of results.jsonl, checkpoints/ and the report"},
    )


@dataclass(frozen=True)
class ReportConfig:
    """Tables (Markdown, CSV) and plots (PNG) of a results file: mean +/- std of the train MSE over seeds."""

    results: Path = field(metadata={"help": "the results.jsonl written by `layer-fit run`"})
    out: Path | None = field(
        default=None, metadata={"help": "output folder (default: RESULTS' folder/report)"}
    )
    budget: int = field(default=32, metadata={"help": "the budget of the main table and the bar plot"})
