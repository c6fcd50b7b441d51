"""Configurations of ``layer-fit``: frozen dataclasses whose fields are the command-line flags, one to one.

The flags shared with the other apps (``--device``, ``--dtype``, ``--threads``, ``--steps``, ``--lr``,
``--grad-clip``, ``--out``, ``--resume``, ``--layer``, ``--features``, ``--weight-matrix``, ``--seed``,
``--log-every``) come from ``app_common``; here ``--layer``, ``--features``, ``--seed`` and ``--activation``
take several values: the grid of runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from app_common import fields
from app_common.fields import (
    OptimizerFields,
    OutputFields,
    RuntimeFields,
    added_settings,
    check_int_fields,
    option,
    run_identity,
)
from app_common.grid import GridFields

#: The activations of the paper's Fig. 2.
ACTIVATIONS = ("gelu", "silu", "tanh", "sigmoid", "softsign")
#: The four methods of Fig. 2, and RaLiMP with a trainable ``Psi`` (``layer_fit.METHODS`` also holds
#: ``linear``, a rank-``r`` linear map).
PAPER_METHODS = ("lowrank", "eugen", "snnk", "ralimp", "ralimp-psi")
#: The budget sweep of the paper's Fig. 2 (right).
SWEEP_BUDGETS = (16, 32, 64, 128, 256)
#: The fields that make the grid (several values each); the rest is the protocol every run shares.
GRID = ("activation", "layer", "features", "seed")


@dataclass(frozen=True, kw_only=True)
class FitConfig(RuntimeFields, OptimizerFields, OutputFields, GridFields):
    """The synthetic single-layer fit (RaLiMP paper, Fig. 2): every activation x layer x features x seed.

    Defaults are the paper's protocol: W (256 x 256) and X (8192 x 256) i.i.d. Unif[0, 1], the
    pre-activation centered by its mean, X and Y = f(X W^T) standardized per column, full-batch Adam at
    lr 1e-2 with cosine decay and gradient-norm clipping at 10 for 3000 steps, 10 seeds, train MSE
    reported. Two departures are on unless --paper-literal: a per-column output scale and shift, and
    balance="auto" for RaLiMP and SNNK (features at x / lambda and lambda w; without it RaLiMP's first
    output at width 256 is not finite: its estimators' variance explodes, and softsign's features
    overflow). Finished runs found in the results file are skipped; a killed run resumes from its
    checkpoint. A run's identity is every setting except device, threads, out, resume, shard, isolation,
    checkpoint_every and log_every; resuming under another identity is refused.
    """

    MAY_CHANGE_ON_RESUME: ClassVar[tuple[str, ...]] = ("checkpoint_every", "log_every")
    #: Settings added after runs were recorded, with the value those runs had: a record without the key
    #: ran with it, and at that value the setting stays out of a run's identity and name.
    ADDED_SETTINGS: ClassVar[Mapping[str, Any]] = {"weight_matrix": "base"}

    activation: tuple[str, ...] = field(
        default=ACTIVATIONS, metadata={"help": "target activations f (several: a grid)", "metavar": "NAME"}
    )
    layer: tuple[str, ...] = option(
        "layer",
        PAPER_METHODS,
        help="here the methods (several values: a grid): lowrank, eugen, snnk, ralimp, ralimp-psi, linear",
        metavar="NAME",
    )
    features: tuple[int, ...] = option(
        "features",
        (32,),
        help="the rank for lowrank and linear; several values: a grid (the paper's sweep: 16 32 64 128 256)",
    )
    seed: tuple[int, ...] = option("seed", tuple(range(10)), help="several values: a grid")
    weight_matrix: str = option("weight_matrix", "base", help="of ralimp, eugen and snnk")
    steps: int = option("steps", 3000, help="full-batch Adam, cosine decay")
    lr: float = option("lr", 1e-2)
    grad_clip: float = option("grad_clip", 10.0)
    samples: int = field(default=8192, metadata={"help": "rows of X"})
    dim: int = field(default=256, metadata={"help": "input and output width (W is dim x dim)"})
    data_seed: int = field(default=0, metadata={"help": "seed of W and X (fixed across runs)"})
    center: str = field(
        default="column",
        metadata={
            "help": "centering of the pre-activation: column (each unit by its mean) or global",
            "choices": ("column", "global"),
        },
    )
    output_affine: bool = field(
        default=True,
        metadata={"help": "follow every method by a per-column scale and shift (a departure)"},
    )
    paper_literal: bool = field(
        default=False,
        metadata={"help": "the paper's layers exactly: balance 1 and no output scale and shift"},
    )
    out: Path = option("out", Path("results/layer-fit"), help="and of report/")
    checkpoint_every: int = option("checkpoint_every", 500)
    log_every: int = option("log_every", 50, help="the points of the record's loss curve")

    def __post_init__(self) -> None:
        """Positive sizes and at least one value of every grid field."""
        super().__post_init__()
        check_int_fields(self, "samples", "dim", "log_every", "features")
        check_int_fields(self, "data_seed", "checkpoint_every", "seed", minimum=0)
        for name in GRID:
            if not getattr(self, name):
                raise ValueError(f"--{name}: expected at least one value")

    @property
    def balance(self) -> float | str:
        """RaLiMP's and SNNK's ``balance``: ``"auto"`` (a departure), or 1 with ``paper_literal``."""
        return 1.0 if self.paper_literal else "auto"

    @property
    def affine(self) -> bool:
        """Whether the output scale and shift is on (never with ``paper_literal``)."""
        return self.output_affine and not self.paper_literal

    def departures(self) -> list[str]:
        """What this protocol does that the paper does not (recorded with every run)."""
        found = []
        if self.balance == "auto":
            found.append(
                "balance='auto' for ralimp and snnk: features at x/lambda, lambda w (not in the paper)"
            )
        if self.affine:
            found.append("output scale and shift per column after every method (not in the paper)")
        return found

    def protocol(self) -> dict:
        """The settings every run of the grid shares: a run's identity without its grid point.

        A setting of ``ADDED_SETTINGS`` at the value older records ran with is left out
        ([`run_identity`][app_common.fields.run_identity]).
        """
        return {k: v for k, v in run_identity(self).items() if k not in GRID}

    def full_protocol(self) -> dict:
        """`protocol` with every setting of ``ADDED_SETTINGS``: what records are compared by."""
        return {**added_settings(self), **self.protocol()}

    def run_identity(self, activation: str, method: str, budget: int, seed: int) -> dict[str, Any]:
        """The identity of one run of the grid: the `protocol` and its grid point."""
        return {
            **self.protocol(),
            "activation": activation,
            "layer": method,
            "features": budget,
            "seed": seed,
        }

    def run_name(self, activation: str, method: str, budget: int, seed: int) -> str:
        """``gelu-ralimp-b32-s0-1a2b3c4d``: the run's label and a digest of its `run_identity`.

        The apps' one scheme ([`app_common.fields.run_name`][app_common.fields.run_name]).
        """
        label = run_label(activation, method, budget, seed)
        return fields.run_name(label, self.run_identity(activation, method, budget, seed))


def run_label(activation: str, method: str, budget: int, seed: int) -> str:
    """``gelu-ralimp-b32-s0``: the head of a run's name.

    Records written before the names had a digest have the label as their whole name.
    """
    return f"{activation}-{method}-b{budget}-s{seed}"


def recorded_protocol(record: Mapping[str, Any], keys: Iterable[str]) -> dict:
    """The settings ``keys`` of a flat record; one of ``ADDED_SETTINGS`` it lacks at the value it ran with."""
    added = added_settings(FitConfig)
    return {k: record.get(k, added.get(k)) for k in keys}


@dataclass(frozen=True, kw_only=True)
class QuickConfig(FitConfig):
    """A reduced protocol that runs in about two minutes on two CPU cores, then prints the report.

    Every activation and method at 32 features, but 512 x 64 data, 200 steps, 2 seeds, one CPU thread: a
    check of the whole pipeline (data, training, results, tables, plots), not the paper's measurement.
    """

    seed: tuple[int, ...] = option("seed", (0, 1))
    steps: int = option("steps", 200, help="full-batch Adam, cosine decay")
    samples: int = field(default=512, metadata={"help": "rows of X"})
    dim: int = field(default=64, metadata={"help": "input and output width (W is dim x dim)"})
    threads: int = option("threads", 1)
    checkpoint_every: int = option("checkpoint_every", 0)
    out: Path = option("out", Path("results/layer-fit-quick"), help="and of report/")


@dataclass(frozen=True)
class ReportConfig:
    """Tables (Markdown, CSV) and plots (PNG) of a results file: mean +/- std of the train MSE over seeds."""

    results: Path = field(metadata={"help": "the results.jsonl written by layer-fit train"})
    report_dir: Path | None = option("report_dir", None)
    table_features: int = field(
        default=32, metadata={"help": "the budget of the main table and the bar plot"}
    )
