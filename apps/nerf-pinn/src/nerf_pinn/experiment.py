"""The comparison every family runs: dense vs linearized variants, trained, evaluated and timed together.

A family (PINN, SIREN, NeRF) gives a `Family`: how to build each variant, its training loss, optimizers
and phases, evaluation, inference and plots. `compare` trains the variants one after the other through
``app_common.harness.Trainer`` (`train_variant`: ``<out>/runs/<kind>-s<seed>-<digest>/``, resumed from
its checkpoint, a finished one only restored), then times the inference of all of them in interleaved
rounds so that each ratio to the dense model is measured in the same run under the same load, and writes
``results.jsonl``, ``results.md``, ``results.csv`` and the family's plots.
"""

from __future__ import annotations

import abc
import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import app_common.results
import ralimp
from app_common.config import config_dict
from app_common.device import resolve_device
from app_common.fields import run_identity
from app_common.harness import Trainer
from app_common.measure import count_parameters, interleaved_medians
from app_common.plots import pyplot, save_figure
from app_common.records import RESULTS
from app_common.results import markdown_table, read_jsonl
from app_common.run import Run
from nerf_pinn.config import CompareConfig, replaced_layers
from nerf_pinn.layers import DENSE, SHAPE_OPTIONS, inference_parameters, linearize_mlp_layers, stack_inputs


class Family(abc.ABC):
    """One experiment family: what `compare` needs to know about it."""

    #: Family name (the subcommand).
    name: str
    #: Name of the task metric in the records and the table.
    metric: str
    #: The metric's axis label in figures.
    metric_label: str
    #: Whether a lower metric is better (figures draw it on a log scale).
    metric_lower_is_better: bool = False

    def __init_subclass__(cls, *, name: str, metric: str, **kwargs: Any) -> None:
        """Name and metric as class keywords: ``class SirenFamily(Family, name="siren", metric="psnr")``."""
        super().__init_subclass__(**kwargs)
        cls.name, cls.metric = name, metric

    @classmethod
    def metric_from_loss(cls, train_loss: float) -> float | None:
        """The metric a training loss bounds (an unfinished run's last step); None: the loss bounds none."""
        return None

    def __init__(self, config: CompareConfig) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        if config.threads:
            torch.set_num_threads(config.threads)

    @abc.abstractmethod
    def build(self, kind: str) -> nn.Module:
        """The model of variant ``kind`` (the dense model, linearized for the other kinds), on the device."""

    @abc.abstractmethod
    def loss(self, model: nn.Module, step: int) -> torch.Tensor:
        """The training loss of step ``step`` (the harness runs backward, clipping and the update)."""

    def optimizers(self, model: nn.Module) -> dict[str, torch.optim.Optimizer]:
        """The optimizers by name: Adam at ``lr`` by default."""
        return {"adam": torch.optim.Adam(model.parameters(), lr=self.config.lr)}

    def phases(self) -> list[tuple[str, int]]:
        """``[(optimizer name, steps), ...]`` run one after the other: Adam for ``steps`` by default."""
        return [("adam", self.config.steps)]

    def stop_reason(self) -> str | None:
        """Why training ends early (checked before each step, which is then the last); None: it goes on."""
        return None

    def summary(self) -> dict[str, Any]:
        """Facts about the finished training that go into the record (none by default)."""
        return {}

    def training_state(self) -> dict[str, Any]:
        """Random state the loss draws from besides the global one (checkpointed); none by default."""
        return {}

    @abc.abstractmethod
    def evaluate(self, model: nn.Module) -> dict[str, Any]:
        """Metrics (``self.metric`` among them, numbers) and ``"outputs"`` kept for the plots."""

    @abc.abstractmethod
    def infer(self, model: nn.Module) -> object:
        """One inference pass (the timed work): the whole evaluation grid, image, or held-out view."""

    @abc.abstractmethod
    def plot(self, outputs: dict[str, Any], out: Path) -> list[Path]:
        """PNG plots of every variant's outputs; the paths written."""

    def linearize_mlp_layers(
        self, layers: nn.ModuleList, kind: str, indices: list[int], inputs: list[torch.Tensor]
    ) -> None:
        """`linearize_mlp_layers` with this family's budget, rational fit and projections."""
        config = self.config
        linearize_mlp_layers(
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
            fit_range=config.fit_range,
            fit=config.fit,
            seed=config.seed,
        )

    def linearize_mlp_stack(self, layers: nn.ModuleList, kind: str, depth: int, sample: torch.Tensor) -> None:
        """Linearize the MLP layers of a stack that ``--replace`` names, calibrated on their inputs.

        ``sample`` is ``(n, in_features)``: each replaced layer is calibrated on what it receives when the
        stack reads it.
        """
        self.linearize_mlp_layers(
            layers, kind, replaced_layers(self.config.replace, depth), stack_inputs(layers, sample)
        )

    def settings(self) -> dict[str, Any]:
        """What the records say about the setting (the config, as plain values)."""
        return config_dict(self.config)

    def run(self, kind: str, on_checkpoint: Callable[[int], None] | None = None) -> Run:
        """The run of variant ``kind`` under its `identity`, seeded with ``seed``.

        Its name is the apps' one scheme ([`app_common.fields.run_name`][app_common.fields.run_name]):
        ``<kind>-s<seed>`` and a digest of its identity. With ``dense_from`` the dense run is the one of
        that name under ``<dense_from>/runs/``, which must have finished.

        Raises:
            ValueError: ``dense_from`` holds no finished dense run of these settings.
        """
        restored = kind == DENSE and self.config.dense_from is not None
        out = self.config.dense_from if restored else self.config.out
        run = Run.from_config(
            self.config,
            label=f"{kind}-s{self.config.seed}",
            on_save=on_checkpoint,
            identity=self.identity(kind),
            device=self.device,
            distributed=False,
            out=out,
        )
        if restored and run.finished() is None:
            others = "".join(
                f"; it holds {name} of other settings ({'; '.join(changed) or 'unknown'})"
                for name, changed in run.namesakes().items()
            )
            raise ValueError(
                f"--dense-from: {out} holds no finished dense run of these settings "
                f"({run.dir / 'record.json'} is missing){others}; expected the --out folder of a comparison "
                "whose dense variant finished"
            )
        return run

    def trainer(self, run: Run, model: nn.Module) -> Trainer:
        """The harness of a variant's ``model``: its optimizers, phases, a log line per step, NaN stops it."""
        optimizers, phases = self.optimizers(model), self.phases()
        return Trainer.from_config(
            self.config,
            run,
            model,
            optimizers,
            steps=sum(count for _, count in phases),
            phases=phases,
            state=self.training_state(),
            log_every=1,
            on_nan="stop",
        )

    def identity(self, kind: str) -> dict[str, Any]:
        """A variant's identity: the family, the kind and the settings that may not change on resume.

        The layer settings a kind does not use are left out (`layer_settings`), so that the dense run of one
        comparison is the dense run of another that differs only in, say, RaLiMP's fit.
        """
        unused = set(layer_settings(None)) - set(layer_settings(kind))
        settings = {k: v for k, v in run_identity(self.config).items() if k not in unused}
        return {"family": self.name, "kind": kind, **settings}


def layer_settings(kind: str | None) -> tuple[str, ...]:
    """The settings that shape the linearized layers of ``kind`` (None: of any kind; dense: none)."""
    if kind == DENSE:
        return ()
    shared = ("features", "replace", "weight_matrix", "fit_range")
    options = SHAPE_OPTIONS[kind] if kind is not None else tuple(o for v in SHAPE_OPTIONS.values() for o in v)
    return tuple(dict.fromkeys((*shared, *options)))


def format_metric(value: float) -> str:
    """A metric in the table: 3 significant digits; ``not finite`` for inf and NaN."""
    if not math.isfinite(value):
        return "not finite"
    return f"{value:.3g}" if abs(value) < 1e-2 or abs(value) >= 1e3 else f"{value:.4g}"


def metric_cell(record: dict[str, Any], metric: str) -> str:
    """The metric of a record, or the (1-based) step at which its training loss became non-finite."""
    if record["diverged_at"] is not None:
        return f"diverged at step {record['diverged_at'] + 1}"
    return format_metric(record[metric])


def results_table(records: list[dict], metric: str) -> str:
    """The Markdown table of one family's records (a variant whose loss became non-finite: where).

    Records of several seeds get a seed column.
    """
    seeds = len({r.get("seed") for r in records}) > 1
    header = [
        "variant",
        *(["seed"] if seeds else []),
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
            *([str(r["seed"])] if seeds else []),
            metric_cell(r, metric),
            str(r["params"]),
            str(r["inference_params"]),
            f"{r['time_ratio']:.2f}",
            f"{r['train_seconds']:.0f}",
            format_metric(r["final_loss"]),
        ]
        for r in records
    ]
    return markdown_table(header, rows)


def write_csv(records: list[dict], metric: str, path: Path) -> Path:
    """The table's columns as CSV, at full precision."""
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
        "seed",
    ]
    return app_common.results.write_csv(path, columns, ([r[c] for c in columns] for r in records))


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
    models, evaluations, records, trainers = {}, {}, [], {}
    for kind in config.layer:
        trainer, model, losses = train_variant(family, kind, on_checkpoint=on_checkpoint)
        trainers[kind] = trainer
        model.eval()
        evaluation = family.evaluate(model)
        stride = max(1, len(losses) // 200)
        models[kind], evaluations[kind] = model, evaluation
        records.append(
            {
                "family": family.name,
                "kind": kind,
                "seed": config.seed,
                "departures": config.departures(kind, model),
                family.metric: evaluation[family.metric],
                **{k: v for k, v in evaluation.items() if k not in ("outputs", family.metric)},
                **family.summary(),
                "params": count_parameters(model),
                "inference_params": inference_parameters(model),
                "fits": ralimp.fit_summary(model),
                "train_seconds": trainer.train_seconds,
                "diverged_at": trainer.diverged_at,
                "initial_loss": losses[0] if losses else float("nan"),
                "final_loss": losses[-1] if losses else float("nan"),
                "losses": losses[::stride],
                "loss_stride": stride,
            }
        )
    for model in models.values():
        model.eval()
    with torch.no_grad():
        times = interleaved_medians(
            {kind: functools.partial(family.infer, model) for kind, model in models.items()},
            repeats=config.time_repeats,
            device=family.device,
        )
    for record in records:
        record["inference_seconds"] = times[record["kind"]]
        record["time_ratio"] = times[record["kind"]] / times[DENSE]
    results = out / RESULTS
    results.unlink(missing_ok=True)
    for record in records:
        metrics = {family.metric: record[family.metric], "time_ratio": record["time_ratio"]}
        details = {
            k: v for k, v in record.items() if k not in (*metrics, "seed", "train_seconds", "diverged_at")
        }
        full = trainers[record["kind"]].record(config, metrics=metrics, details=details)
        if record["kind"] == DENSE and config.dense_from is not None:
            app_common.results.append_jsonl(results, full)  # the restored run's own folder stays as it is
        else:
            trainers[record["kind"]].finish(full)
    table = results_table(records, family.metric)
    (out / "results.md").write_text(table + "\n")
    write_csv(records, family.metric, out / "results.csv")
    family.plot({kind: e["outputs"] for kind, e in evaluations.items()}, out)
    plot_losses(records, out / "losses.png")
    return records


def train_variant(
    family: Family, kind: str, *, on_checkpoint: Callable[[int], None] | None = None
) -> tuple[Trainer, nn.Module, list[float]]:
    """Variant ``kind`` trained through the harness (or loaded: a finished one only restores).

    Returns:
        The harness (its ``train_seconds``, ``diverged_at``, ``record``), the model and the per-step losses.
    """
    run = family.run(kind, on_checkpoint)
    model = family.build(kind)  # seeds itself: the same model fresh or resumed
    trainer = family.trainer(run, model)

    def loss(step: int, batch: object) -> torch.Tensor:
        reason = family.stop_reason()
        if reason is not None:
            trainer.stop(reason)
        return family.loss(model, step)

    trainer.fit(loss)
    losses = [r["train_loss"] for r in read_jsonl(run.log_path, missing_ok=True) if "train_loss" in r]
    return trainer, model, losses


def plot_losses(records: list[dict], path: Path) -> Path:
    """Training loss curves of every variant (log scale)."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for r in records:
        losses, stride = r["losses"], r["loss_stride"]
        ax.semilogy(range(0, len(losses) * stride, stride), losses, label=r["kind"])
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.legend()
    return save_figure(fig, path, dpi=120)
