"""Training: one run (method, activation, budget, seed) and the resumable grid of runs.

Each run is full-batch Adam on the MSE between the model's output and the standardized targets, with a
cosine learning-rate decay to 0 over ``steps`` and the gradient norm clipped at ``grad_clip``, run by
``app_common.harness.Trainer``; the reported figure is the train MSE of the final model (evaluated once more
after the last step), next to the two floors of [`layer_fit.floors`][layer_fit.floors]. Every run has
its folder ``<out>/runs/<name>/`` (the name of `layer_fit.config.FitConfig.run_name`: checkpoint every
``checkpoint_every`` steps, log, record) and one JSON line in ``<out>/results.jsonl``; a killed run
resumes from its checkpoint (refused under another identity) to the result of an unbroken one. A run
whose method does not start (it raises one of `START_ERRORS` while it is built or first evaluated, or its
first loss is not finite) is recorded with the reason (``not_started``) and the grid goes on.
"""

from __future__ import annotations

import itertools
import math
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

import ralimp
from app_common.checkpoint import changed_settings
from app_common.device import autocast, device_name, resolve_device
from app_common.grid import run_grid
from app_common.harness import Trainer
from app_common.records import RESULTS, finished_record, flat_record, make_record, write_record
from app_common.results import read_jsonl
from app_common.run import Run
from app_common.schedules import schedule
from layer_fit.config import FitConfig, recorded_protocol, run_label
from layer_fit.data import LayerData, make_data
from layer_fit.floors import eckart_young_floor, fixed_features, information_floor, singular_values
from layer_fit.methods import METHODS, FitModel, build

#: What a method raises when it cannot start on a run's data: ``ValueError`` (RaLiMP's exponent guard, a
#: budget or a fit it cannot make, features that overflow the readout's solve) and
#: ``torch.linalg.LinAlgError`` (a singular fit). Any other error is a bug and ends the grid.
START_ERRORS: tuple[type[Exception], ...] = (ValueError, torch.linalg.LinAlgError)


def fit_one(
    data: LayerData,
    method: str,
    budget: int,
    seed: int,
    config: FitConfig,
    *,
    device: torch.device,
    out: Path | None = None,
    progress: bool = True,
    sigma: torch.Tensor | None = None,
    on_checkpoint: Callable[[int], None] | None = None,
) -> dict:
    """Train ``method`` at ``budget`` with ``seed`` on ``data``; returns the run's record.

    The run goes through ``app_common.harness.Trainer`` under ``<out>/runs/<name>/`` (resumed from its
    checkpoint under ``config.resume``, checkpointed every ``config.checkpoint_every`` steps, its record
    written there and appended to ``<out>/results.jsonl``); without ``out`` in a temporary folder that is
    removed afterwards. A run that finished under its label alone (``<out>/runs/gelu-ralimp-b32-s0/``, as
    runs were named before the digest) is reused when it ran this protocol. A loss that stops being finite
    ends the run as diverged (``diverged_at_step``); a method that does not start (`START_ERRORS` while
    the model is built or first evaluated, or a first loss that is not finite) gives a record with the
    reason under ``not_started`` and no MSE.

    Args:
        data: standardized inputs and targets on ``device``.
        method: a name in [`layer_fit.METHODS`][layer_fit.METHODS].
        budget: the feature budget (rank for ``lowrank``/``linear``).
        seed: seed of the initial dense layer and of the method's random projections.
        config: the protocol (steps, lr, grad_clip, departures, dtype, checkpoint_every, log_every).
        device: where the model lives.
        out: the folder holding ``runs/`` and ``results.jsonl`` (None: a temporary one, nothing kept).
        progress: draw a step bar.
        sigma: the singular values of ``data.y`` (computed here when not given).
        on_checkpoint: called with the step after every checkpoint (tests stop the run there).
    """
    if out is None:
        with tempfile.TemporaryDirectory(prefix="layer-fit-") as folder:
            return fit_one(
                data, method, budget, seed, config, device=device, out=Path(folder), progress=progress,
                sigma=sigma, on_checkpoint=on_checkpoint,
            )  # fmt: skip
    label = run_label(data.activation, method, budget, seed)
    if config.resume and (earlier := _recorded_under_label(out, label, config)) is not None:
        return earlier
    run = Run.from_config(
        config,
        label=label,
        identity=config.run_identity(data.activation, method, budget, seed),
        on_save=on_checkpoint,
        out=out,
        seed=seed,
        device=device,
        distributed=False,
    )
    if (record := run.finished()) is not None:
        return record
    details = {"activation": data.activation, "method": method, "budget": budget, **config.protocol()}
    try:
        model = build(
            method,
            data.activation,
            budget,
            dim=data.x.shape[-1],
            seed=seed,
            sample=data.calibration_sample,
            balance=config.balance,
            output_affine=config.affine,
            weight_matrix=config.weight_matrix,
            device=device,
        )
        floors = _floors(model, data, sigma if sigma is not None else singular_values(data.y), config.affine)
        with torch.no_grad():
            initial = float(_loss(model, data, config, device))  # the built model: the same on every resume
    except START_ERRORS as error:
        return _not_started(run, config, details, f"{type(error).__name__}: {error}")
    if not math.isfinite(initial):
        return _not_started(run, config, details, f"the first loss is {initial}", model)
    adam = torch.optim.Adam(model.parameters(), lr=config.lr)
    trainer = Trainer.from_config(
        config,
        run,
        model,
        adam,
        schedule=schedule("cosine", 0, config.steps),
        on_nan="stop",
        show_progress=progress,
    )
    trainer.fit(lambda step, batch: _loss(model, data, config, device))
    model.eval()
    final = math.nan
    if trainer.diverged_at is None:
        with torch.no_grad():
            final = float(_loss(model, data, config, device))
    diverged_at = (
        trainer.diverged_at if math.isfinite(final) or trainer.diverged_at is not None else config.steps
    )
    curve = [
        [r["step"], r["train_loss"]] for r in read_jsonl(run.log_path, missing_ok=True) if "train_loss" in r
    ]
    record = trainer.record(
        config,
        metrics={"mse": final if math.isfinite(final) else None, "mse_init": initial, **floors},
        details={
            **details,
            "fits": ralimp.fit_summary(model),
            "departures": config.departures(),
            "diverged": diverged_at is not None,
            "diverged_at_step": diverged_at,
            "num_random_features": int(getattr(model.layer, "num_random_features", budget)),
            "curve": curve,
            "threads": torch.get_num_threads(),
        },
    )
    return trainer.finish(record)


def _recorded_under_label(out: Path, label: str, config: FitConfig) -> dict | None:
    """The record of a run finished under its label alone (names before the digest), if of this protocol."""
    record = finished_record(out, label)
    if record is None:
        return None
    wanted = config.full_protocol()
    return None if changed_settings(recorded_protocol(flat_record(record), wanted), wanted) else record


def _not_started(
    run: Run, config: FitConfig, details: dict, reason: str, model: torch.nn.Module | None = None
) -> dict:
    """Write and return the record of a run that does not start: ``not_started`` = ``reason``, no MSE."""
    record = make_record(
        name=run.name,
        config=config,
        seed=run.seed,
        device=device_name(run.device),
        model=model if model is not None else torch.nn.Module(),
        train_seconds=0.0,
        metrics={"mse": None, "mse_init": None},
        details={
            **details,
            "not_started": reason,
            "departures": config.departures(),
            "diverged": False,
            "threads": torch.get_num_threads(),
        },
        steps=0,
    )
    write_record(run.out, record)
    return record


def _loss(model: FitModel, data: LayerData, config: FitConfig, device: torch.device) -> torch.Tensor:
    with autocast(device, config.dtype):
        prediction = model(data.x)
    return F.mse_loss(prediction.float(), data.y.float())


def _floors(model: FitModel, data: LayerData, sigma: torch.Tensor, affine: bool) -> dict:
    """The run's two floors (None for a method without fixed features: LowRank, linear)."""
    features = fixed_features(model.layer)
    if features is None:
        return {"feature_dim": None, "information_floor": None, "eckart_young_floor": None}
    with torch.no_grad():
        phi = features(data.x)
    width = phi.shape[-1]
    rank = min(width + int(affine), len(sigma))
    return {
        "feature_dim": width,
        "information_floor": information_floor(phi, data.y),
        "eckart_young_floor": eckart_young_floor(sigma, rank, data.y.numel()),
    }


def planned_runs(config: FitConfig) -> list[tuple[str, str, int, int]]:
    """Every ``(activation, method, budget, seed)`` of the grid, activation-major (one dataset at a time)."""
    for method in config.layer:
        METHODS.get(method)  # unknown names fail before any run
    return list(itertools.product(config.activation, config.layer, config.features, config.seed))


def _check_results_protocol(results: Path, config: FitConfig) -> list[dict]:
    """The finished records of ``results`` (none without ``resume``); refused if of another protocol."""
    if not config.resume:
        results.unlink(missing_ok=True)
        shutil.rmtree(results.parent / "runs", ignore_errors=True)
        return []
    records = [flat_record(r) for r in read_jsonl(results, missing_ok=True)]
    wanted = config.full_protocol()
    for record in records:
        changed = changed_settings(recorded_protocol(record, wanted), wanted)
        if changed:
            raise ValueError(
                f"{results}: holds runs of other settings ({'; '.join(changed)}); pass --no-resume to start "
                "over or another --out"
            )
    return records


@dataclass
class _Cells:
    """Runs one cell ``(activation, method, budget, seed)``; the data of the last activation is kept."""

    config: FitConfig
    progress: bool
    on_checkpoint: Callable[[int], None] | None
    data: LayerData | None = None
    sigma: torch.Tensor | None = None

    def __call__(self, cell: tuple[str, str, int, int]) -> dict:
        activation, method, budget, seed = cell
        config = self.config
        device = resolve_device(config.device)
        if self.data is None or self.data.activation != activation:
            self.data = make_data(
                activation,
                samples=config.samples,
                dim=config.dim,
                seed=config.data_seed,
                center=config.center,
                device=device,
            )
            self.sigma = singular_values(self.data.y)
        return fit_one(
            self.data,
            method,
            budget,
            seed,
            config,
            device=device,
            out=Path(config.out),
            progress=self.progress,
            sigma=self.sigma,
            on_checkpoint=self.on_checkpoint,
        )


def run_fit(
    config: FitConfig, *, progress: bool = True, on_checkpoint: Callable[[int], None] | None = None
) -> Path:
    """Run this shard's planned runs that have not finished, through `app_common.grid.run_grid`.

    Args:
        config: the grid, its protocol and its ``--shard`` / ``--isolation`` (in-process by default: the
            runs of one activation share its data).
        progress: draw progress bars.
        on_checkpoint: called with the step after every checkpoint of every run (tests stop a run there).

    Returns:
        The results path.
    """
    if config.threads:
        torch.set_num_threads(config.threads)
    results = Path(config.out) / RESULTS
    _check_results_protocol(results, config)
    run_grid(
        planned_runs(config),
        _Cells(config, progress, on_checkpoint),
        place=lambda cell: (config.out, config.run_name(*cell)),
        grid=config,
        desc="layer-fit",
        show_progress=progress,
    )
    return results
