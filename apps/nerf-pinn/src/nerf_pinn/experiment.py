"""The comparison every family runs: dense vs linearized variants, trained, evaluated and timed together.

A family (PINN, SIREN, NeRF) gives a `Family`: how to build each variant, train it (with
`VariantCheckpoints` for resuming), evaluate it, run its inference, and plot. `compare` trains the
variants one after the other (a finished one is loaded from ``<out>/<kind>/final.pt``), then times the
inference of all of them in interleaved rounds so that each ratio to the dense model is measured in the
same run under the same load, and writes ``results.jsonl``, ``results.md``, ``results.csv`` and the
family's plots.
"""

from __future__ import annotations

import abc
import functools
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import app_common as ac
import ralimp
from nerf_pinn.config import CompareConfig
from nerf_pinn.layers import DENSE, inference_parameters, linearize


class VariantCheckpoints:
    """Periodic checkpoints of one variant's training (model, optimizers, step, losses, RNG, seconds).

    The one resume policy of the apps (``app_common.Checkpointer``): a checkpoint saved under another
    identity is refused with the changed settings listed.

    Args:
        path: the checkpoint file.
        every: steps between checkpoints.
        identity: the variant's identity (``app_common.run_identity`` of the config, and the kind).
        resume: read an existing checkpoint (else start over).
        on_save: called with the step after every checkpoint (tests stop the run there).
    """

    def __init__(
        self,
        path: Path,
        every: int,
        identity: dict[str, Any],
        *,
        resume: bool = True,
        on_save: Callable[[int], None] | None = None,
    ) -> None:
        self.checkpointer = ac.Checkpointer(path, identity, resume=resume, on_save=on_save)
        self.every = every
        self.state = self.checkpointer.load()
        self.timer = ac.Timer(elapsed=self.state["seconds"] if self.state else 0.0)

    def restore(
        self, model: nn.Module, optimizers: dict[str, torch.optim.Optimizer]
    ) -> tuple[int, list[float]]:
        """Load the saved state into ``model`` and ``optimizers``; ``(next step, losses so far)``."""
        if self.state is None:
            return 0, []
        ac.load_state_dicts(self.state, model=model)
        ac.load_state_dicts(
            self.state["optimizers"], **{k: v for k, v in optimizers.items() if k in self.state["optimizers"]}
        )
        ac.set_rng_state(self.state["rng"])
        return int(self.state["step"]), list(self.state["losses"])

    def step(
        self, step: int, model: nn.Module, optimizers: dict[str, torch.optim.Optimizer], losses: list[float]
    ) -> None:
        """Save after ``step`` steps when ``step`` is a multiple of ``every``."""
        if step % self.every:
            return
        state = {
            **ac.state_dicts(model=model),
            "optimizers": ac.state_dicts(**optimizers),
            "losses": losses,
            "rng": ac.rng_state(),
            "seconds": self.timer.running_total,
        }
        self.checkpointer.save(step, state)

    def remove(self) -> None:
        """Delete the checkpoint (the variant finished)."""
        self.checkpointer.remove()


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
    def train(self, model: nn.Module, checkpoints: VariantCheckpoints, kind: str) -> list[float]:
        """Train ``model`` in place (resuming from ``checkpoints``); the training losses."""

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
            balance=config.balance_value(),
            seed=config.seed,
        )

    def record_step(
        self,
        bar: Any,
        kind: str,
        step: int,
        value: float,
        losses: list[float],
        checkpoints: VariantCheckpoints,
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
        checkpoints.step(step + 1, model, optimizers, losses)
        return True

    def clip(self, model: nn.Module) -> None:
        """Clip the gradient norm at ``grad_clip`` (0: no clipping), before an optimizer step."""
        if self.config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.config.grad_clip)

    def settings(self) -> dict[str, Any]:
        """What the records say about the setting (the config, as plain values)."""
        return ac.config_dict(self.config)

    def identity(self, kind: str) -> dict[str, Any]:
        """A variant's identity: the family, the kind and the settings that may not change on resume."""
        return {"family": self.name, "kind": kind, **ac.run_identity(self.config)}


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
    return ac.markdown_table(header, rows)


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


def compare(family: Family, *, on_checkpoint: Callable[[int], None] | None = None) -> list[dict]:
    """Train, evaluate and time every variant of ``family``; write results and plots under ``config.out``.

    Args:
        family: the family and its configuration.
        on_checkpoint: called with the step after every checkpoint (tests stop the run there).

    Returns:
        One record per variant (also the lines of ``results.jsonl``).
    """
    config = family.config
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    models, evaluations, records = {}, {}, []
    for kind in config.layer:
        model, losses, seconds = _trained_variant(family, kind, on_checkpoint)
        model.eval()
        evaluation = family.evaluate(model)
        stride = max(1, len(losses) // 200)
        models[kind], evaluations[kind] = model, evaluation
        records.append(
            {
                "family": family.name,
                "kind": kind,
                "departures": config.departures(kind),
                family.metric: evaluation[family.metric],
                **{k: v for k, v in evaluation.items() if k not in ("outputs", family.metric)},
                "params": ac.count_parameters(model),
                "inference_params": inference_parameters(model),
                "fits": ralimp.fit_summary(model),
                "train_seconds": seconds,
                "initial_loss": losses[0] if losses else float("nan"),
                "final_loss": losses[-1] if losses else float("nan"),
                "losses": losses[::stride],
                "loss_stride": stride,
            }
        )
    for model in models.values():
        model.eval()
    with torch.no_grad():
        times = ac.interleaved_medians(
            {kind: functools.partial(family.infer, model) for kind, model in models.items()},
            repeats=config.time_repeats,
            device=family.device,
        )
    for record in records:
        record["inference_seconds"] = times[record["kind"]]
        record["time_ratio"] = times[record["kind"]] / times[DENSE]
        record["device"] = ac.device_name(family.device)
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


def _trained_variant(family: Family, kind: str, on_checkpoint) -> tuple[nn.Module, list[float], float]:
    """Variant ``kind`` trained: loaded from ``<out>/<kind>/final.pt`` when finished, else trained now."""
    config = family.config
    out = Path(config.out) / kind
    ac.seed_everything(config.seed)
    model = family.build(kind)
    final = ac.Checkpointer(out / "final.pt", family.identity(kind), resume=config.resume)
    state = final.load(map_location=family.device)
    if state is not None:
        ac.load_state_dicts(state, model=model)
        return model, list(state["losses"]), float(state["seconds"])
    checkpoints = VariantCheckpoints(
        out / "checkpoint.pt",
        config.checkpoint_every,
        family.identity(kind),
        resume=config.resume,
        on_save=on_checkpoint,
    )
    with checkpoints.timer:
        losses = family.train(model, checkpoints, kind)
    seconds = checkpoints.timer.elapsed
    final.save(len(losses), {**ac.state_dicts(model=model), "losses": losses, "seconds": seconds})
    checkpoints.remove()
    return model, losses, seconds


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
