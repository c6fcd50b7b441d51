"""The comparison every family runs: dense vs linearized variants, trained, evaluated and timed together.

A family (PINN, SIREN, NeRF) gives a `Family`: how to build each variant, train it (with
`Checkpointer` for resuming), evaluate it, run its inference, and plot. `compare` trains the
variants one after the other (a finished one is loaded from ``<out>/<kind>/final.pt``), then times the
inference of all of them in interleaved rounds so that each ratio to the dense model is measured in the
same run under the same load, and writes ``results.jsonl``, ``results.md``, ``results.csv`` and the
family's plots.
"""

from __future__ import annotations

import abc
import math
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import app_common as ac
from nerf_pinn.config import CompareConfig
from nerf_pinn.layers import DENSE, count_parameters, inference_parameters, linearize, time_inference
from spectraformer_core import markdown_table

#: Settings that do not change what a variant computes: a checkpoint saved under other values still fits.
NOT_IDENTITY = ("kinds", "out", "resume", "device", "threads", "checkpoint_every", "time_repeats")


def identity(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings that decide what a variant computes (`NOT_IDENTITY` left out)."""
    return {k: v for k, v in settings.items() if k not in NOT_IDENTITY}


def check_settings(path: Path, state: dict[str, Any], settings: dict[str, Any]) -> None:
    """Refuse to resume from ``path`` when it was saved under other settings."""
    saved = identity(state.get("settings", {}))
    wanted = identity(settings)
    changed = sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))
    if changed:
        details = ", ".join(f"{k}: {saved.get(k)!r} -> {wanted.get(k)!r}" for k in changed)
        raise ValueError(f"{path}: saved under other settings ({details}); pass --no-resume or another --out")


class Checkpointer:
    """Periodic checkpoints of one variant's training (model, optimizers, step, losses, RNG, seconds).

    Args:
        path: the checkpoint file.
        every: steps between checkpoints.
        resume: read an existing checkpoint (else start over).
        settings: the run's settings, saved with each checkpoint and checked on resuming (None: no check).
    """

    def __init__(self, path: Path, every: int, resume: bool, settings: dict[str, Any] | None = None) -> None:
        self.path, self.every, self.settings = Path(path), every, settings
        self.state = ac.load_checkpoint(path) if resume else None
        if self.state is not None and settings is not None:
            check_settings(self.path, self.state, settings)
        self.timer = ac.Timer(elapsed=self.state["seconds"] if self.state else 0.0)

    def restore(
        self, model: nn.Module, optimizers: dict[str, torch.optim.Optimizer]
    ) -> tuple[int, list[float]]:
        """Load the saved state into ``model`` and ``optimizers``; ``(next step, losses so far)``."""
        if self.state is None:
            return 0, []
        model.load_state_dict(self.state["model"])
        for name, optimizer in optimizers.items():
            if name in self.state["optimizers"]:
                optimizer.load_state_dict(self.state["optimizers"][name])
        ac.set_rng_state(self.state["rng"])
        return int(self.state["step"]), list(self.state["losses"])

    def step(
        self, step: int, model: nn.Module, optimizers: dict[str, torch.optim.Optimizer], losses: list[float]
    ) -> None:
        """Save after ``step`` steps when ``step`` is a multiple of ``every``."""
        if step % self.every:
            return
        ac.save_checkpoint(
            self.path,
            {
                "step": step,
                "model": model.state_dict(),
                "optimizers": {name: opt.state_dict() for name, opt in optimizers.items()},
                "losses": losses,
                "rng": ac.rng_state(),
                "seconds": self.timer.running_total,
                "settings": self.settings or {},
            },
        )


class Family(abc.ABC):
    """One experiment family: what `compare` needs to know about it."""

    #: Family name (the subcommand).
    name: str
    #: Name of the task metric in the records and the table.
    metric: str
    #: Whether a larger metric is better (PSNR) or a smaller one (relative L2 error).
    higher_is_better: bool

    def __init__(self, config: CompareConfig) -> None:
        self.config = config
        self.device = ac.resolve_device(config.device)
        if config.threads:
            torch.set_num_threads(config.threads)

    @abc.abstractmethod
    def build(self, kind: str) -> nn.Module:
        """The model of variant ``kind`` (the dense model, linearized for the other kinds), on the device."""

    @abc.abstractmethod
    def train(self, model: nn.Module, checkpointer: Checkpointer, kind: str) -> list[float]:
        """Train ``model`` in place (resuming from ``checkpointer``); the training losses."""

    @abc.abstractmethod
    def evaluate(self, model: nn.Module) -> dict[str, Any]:
        """Metrics (``self.metric`` among them, numbers) and ``"outputs"`` kept for the plots."""

    @abc.abstractmethod
    def infer(self, model: nn.Module) -> object:
        """One inference pass (the timed work): the whole evaluation grid, image, or held-out view."""

    @abc.abstractmethod
    def plot(self, outputs: dict[str, Any], out: Path) -> list[Path]:
        """PNG plots of every variant's outputs; the paths written."""

    def linearize(
        self, layers: nn.ModuleList, kind: str, indices: list[int], inputs: list[torch.Tensor]
    ) -> None:
        """`linearize` with this family's budget, rational fit and projections."""
        config = self.config
        linearize(
            layers,
            kind,
            budget=config.features,
            indices=indices,
            inputs=inputs,
            poly_degree=config.poly_degree,
            num_atoms=config.num_atoms,
            num_freqs=config.num_freqs,
            weight_matrix=config.weight_matrix,
            seed=config.seed,
        )

    def record_step(
        self,
        bar: Any,
        kind: str,
        step: int,
        value: float,
        losses: list[float],
        checkpointer: Checkpointer,
        model: nn.Module,
        optimizers: dict[str, torch.optim.Optimizer],
    ) -> bool:
        """Log step ``step``'s loss; False (diverged: stop training) if it is not finite, else checkpoint."""
        losses.append(value)
        if not math.isfinite(value):
            bar.write(
                f"{self.name} {kind}: the loss became {value} at step {step}; training stops (diverged)"
            )
            return False
        bar.set_postfix(loss=f"{value:.3g}")
        checkpointer.step(step + 1, model, optimizers, losses)
        return True

    def settings(self) -> dict[str, Any]:
        """What the records say about the setting (the config, as plain values)."""
        return ac.config_dict(self.config)


def format_metric(value: float) -> str:
    """A metric in the table: 3 significant digits."""
    return f"{value:.3g}" if abs(value) < 1e-2 or abs(value) >= 1e3 else f"{value:.4g}"


def results_table(records: list[dict], metric: str) -> str:
    """The Markdown table of one family's records."""
    header = [
        "variant",
        metric,
        "params (train)",
        "params (inference)",
        "inference time / dense",
        "train s",
        "final loss",
    ]
    rows = [
        [
            r["kind"],
            format_metric(r[metric]),
            str(r["params"]),
            str(r["inference_params"]),
            f"{r['time_ratio']:.2f}",
            f"{r['train_seconds']:.0f}",
            f"{r['final_loss']:.3g}",
        ]
        for r in records
    ]
    return markdown_table(header, rows)


def write_csv(records: list[dict], metric: str, path: Path) -> Path:
    """The table's columns as CSV, at full precision."""
    import csv

    columns = [
        "kind",
        metric,
        "params",
        "inference_params",
        "time_ratio",
        "inference_seconds",
        "train_seconds",
        "initial_loss",
        "final_loss",
    ]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows([r[c] for c in columns] for r in records)
    return path


def compare(family: Family) -> list[dict]:
    """Train, evaluate and time every variant of ``family``; write results and plots under ``config.out``.

    Returns:
        One record per variant (also the lines of ``results.jsonl``).
    """
    config = family.config
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    models, evaluations, records = {}, {}, []
    for kind in config.kinds:
        ac.seed_everything(config.seed)
        model = family.build(kind)
        final_path = out / kind / "final.pt"
        final = ac.load_checkpoint(final_path, map_location=family.device) if config.resume else None
        if final is not None:
            check_settings(final_path, final, family.settings())
            model.load_state_dict(final["model"])
            losses, seconds = list(final["losses"]), float(final["seconds"])
        else:
            checkpointer = Checkpointer(
                out / kind / "checkpoint.pt", config.checkpoint_every, config.resume, family.settings()
            )
            with checkpointer.timer:
                losses = family.train(model, checkpointer, kind)
            seconds = checkpointer.timer.elapsed
            ac.save_checkpoint(
                final_path,
                {
                    "model": model.state_dict(),
                    "losses": losses,
                    "seconds": seconds,
                    "settings": family.settings(),
                },
            )
            (out / kind / "checkpoint.pt").unlink(missing_ok=True)
        model.eval()
        evaluation = family.evaluate(model)
        stride = max(1, len(losses) // 200)
        models[kind], evaluations[kind] = model, evaluation
        records.append(
            {
                "family": family.name,
                "kind": kind,
                family.metric: evaluation[family.metric],
                **{k: v for k, v in evaluation.items() if k not in ("outputs", family.metric)},
                "params": count_parameters(model),
                "inference_params": inference_parameters(model),
                "train_seconds": seconds,
                "initial_loss": losses[0] if losses else float("nan"),
                "final_loss": losses[-1] if losses else float("nan"),
                "losses": losses[::stride],
                "loss_stride": stride,
            }
        )
    times = time_inference(models, family.infer, repeats=config.time_repeats, device=family.device)
    for record in records:
        record["inference_seconds"] = times[record["kind"]]
        record["time_ratio"] = times[record["kind"]] / times[DENSE]
        record["device"] = str(family.device)
        record["settings"] = family.settings()
        record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    results = out / "results.jsonl"
    results.unlink(missing_ok=True)
    for record in records:
        ac.append_jsonl(results, record)
    table = results_table(records, family.metric)
    (out / "results.md").write_text(table + "\n")
    write_csv(records, family.metric, out / "results.csv")
    family.plot({kind: e["outputs"] for kind, e in evaluations.items()}, out)
    plot_losses(records, out / "losses.png")
    return records


def plot_losses(records: list[dict], path: Path) -> Path:
    """Training loss curves of every variant (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for r in records:
        losses, stride = r["losses"], r["loss_stride"]
        ax.semilogy(range(0, len(losses) * stride, stride), losses, label=r["kind"])
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
