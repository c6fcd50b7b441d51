"""Training: one run (method, activation, budget, seed) and the resumable grid of runs.

Each run is full-batch Adam on the MSE between the model's output and the standardized targets, with a
cosine learning-rate decay to 0 over ``steps`` and the gradient norm clipped at ``grad_clip``; the
reported figure is the train MSE of the final model (evaluated once more after the last step), next to
the two floors of [`layer_fit.floors`][layer_fit.floors]. Finished runs are one JSON line each in
``<out>/results.jsonl``; a run in progress checkpoints every ``checkpoint_every`` steps to
``<out>/checkpoints/`` and resumes from there (``app_common.Checkpointer``: refused under another
identity).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

import app_common as ac
import ralimp
from layer_fit.config import FitConfig
from layer_fit.data import LayerData, make_data
from layer_fit.floors import eckart_young_floor, fixed_features, information_floor, singular_values
from layer_fit.methods import METHODS, FitModel, build

RESULTS = "results.jsonl"


def run_name(activation: str, method: str, budget: int, seed: int) -> str:
    """``gelu-ralimp-b32-s0``: a run's checkpoint name."""
    return f"{activation}-{method}-b{budget}-s{seed}"


def run_key(record: dict) -> tuple:
    """What identifies a finished run in the results: ``(activation, method, budget, seed)``."""
    return (record["activation"], record["method"], int(record["budget"]), int(record["seed"]))


@dataclass
class Progress:
    """A run's counters, saved with its checkpoint."""

    step: int = 0
    seconds: float = 0.0
    initial: float = math.nan
    curve: list[list[float]] = field(default_factory=list)


def fit_one(
    data: LayerData,
    method: str,
    budget: int,
    seed: int,
    config: FitConfig,
    *,
    device: torch.device,
    checkpoint: Path | None = None,
    progress: bool = True,
    sigma: torch.Tensor | None = None,
    on_checkpoint: Callable[[int], None] | None = None,
) -> dict:
    """Train ``method`` at ``budget`` with ``seed`` on ``data``; returns the run's record (no file written).

    Args:
        data: standardized inputs and targets on ``device``.
        method: a name in [`layer_fit.METHODS`][layer_fit.METHODS].
        budget: the feature budget (rank for ``lowrank``/``linear``).
        seed: seed of the initial dense layer and of the method's random projections.
        config: the protocol (steps, lr, grad_clip, departures, dtype, checkpoint_every, log_every).
        device: where the model lives.
        checkpoint: a checkpoint path: resumed from when it holds this run (under ``config.resume``),
            written every ``config.checkpoint_every`` steps, removed when the run finishes.
        progress: draw a step bar.
        sigma: the singular values of ``data.y`` (computed here when not given).
        on_checkpoint: called with the step after every checkpoint (tests stop the run there).
    """
    model = build(
        method,
        data.activation,
        budget,
        dim=data.x.shape[-1],
        seed=seed,
        sample=data.x[: min(len(data.x), 4096)],
        balance=config.balance,
        output_affine=config.affine,
        device=device,
    )
    floors = _floors(model, data, sigma if sigma is not None else singular_values(data.y), config.affine)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config.steps)
    name = run_name(data.activation, method, budget, seed)
    identity = {"run": name, **config.protocol()}
    checkpointer = None
    if checkpoint is not None:
        checkpointer = ac.Checkpointer(checkpoint, identity, resume=config.resume, on_save=on_checkpoint)
    state = checkpointer.load(map_location=device) if checkpointer is not None else None
    if state is not None:
        ac.load_state_dicts(state, model=model, optimizer=optimizer, schedule=schedule)
        run = Progress(**state["progress"])
    else:
        with torch.no_grad():
            run = Progress(initial=float(_loss(model, data, config, device)))
    diverged_at = _train(model, optimizer, schedule, data, config, device, run, checkpointer, name, progress)
    model.eval()
    with torch.no_grad():
        final = float(_loss(model, data, config, device)) if diverged_at is None else math.nan
    if not math.isfinite(final) and diverged_at is None:
        diverged_at = config.steps
    if checkpointer is not None:
        checkpointer.remove()
    return {
        "activation": data.activation,
        "method": method,
        "budget": budget,
        "seed": seed,
        **config.protocol(),
        "departures": config.departures(),
        "fits": ralimp.fit_summary(model),
        "mse": final if math.isfinite(final) else None,
        "mse_init": run.initial if math.isfinite(run.initial) else None,
        **floors,
        "diverged": diverged_at is not None,
        "diverged_at_step": diverged_at,
        "num_random_features": int(getattr(model.layer, "num_random_features", budget)),
        "trainable_params": ac.count_parameters(model),
        "train_seconds": run.seconds,
        "curve": run.curve,
        "device": ac.device_name(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def _loss(model: FitModel, data: LayerData, config: FitConfig, device: torch.device) -> torch.Tensor:
    with ac.autocast(device, config.dtype):
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


def _train(model, optimizer, schedule, data, config, device, run, checkpointer, name, progress) -> int | None:
    """Adam steps from ``run.step`` to ``config.steps``; the step at which the loss diverged, or None."""
    timer = ac.Timer(device, elapsed=run.seconds)
    bar = ac.progress(
        range(run.step, config.steps),
        total=config.steps,
        initial=run.step,
        desc=name,
        leave=False,
        disable=not progress,
    )
    model.train()
    for step in bar:
        timer.start()
        optimizer.zero_grad(set_to_none=True)
        loss = _loss(model, data, config, device)
        if not torch.isfinite(loss):
            run.seconds = timer.stop()
            return step
        loss.backward()
        if config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        schedule.step()
        run.seconds = timer.stop()
        run.step = step + 1
        if step % config.log_every == 0:
            run.curve.append([step, loss.item()])
            bar.set_postfix(mse=f"{run.curve[-1][1]:.4g}")
        every = config.checkpoint_every
        if checkpointer is not None and every and run.step % every == 0 and run.step < config.steps:
            parts = ac.state_dicts(model=model, optimizer=optimizer, schedule=schedule)
            checkpointer.save(run.step, {**parts, "progress": vars(run)})
    bar.close()
    return None


def planned_runs(config: FitConfig) -> list[tuple[str, str, int, int]]:
    """Every ``(activation, method, budget, seed)`` of the grid, activation-major (one dataset at a time)."""
    for method in config.layer:
        METHODS.get(method)  # unknown names fail before any run
    return list(itertools.product(config.activation, config.layer, config.features, config.seed))


def _check_results_protocol(results: Path, config: FitConfig) -> list[dict]:
    """The finished records of ``results`` (none without ``resume``); refused if of another protocol."""
    if not config.resume:
        results.unlink(missing_ok=True)
        return []
    records = ac.read_jsonl(results, missing_ok=True)
    wanted = config.protocol()
    for record in records:
        changed = ac.changed_settings({k: record.get(k) for k in wanted}, wanted)
        if changed:
            raise ValueError(
                f"{results}: holds runs of other settings ({'; '.join(changed)}); pass --no-resume to start "
                "over or another --out"
            )
    return records


def run_fit(config: FitConfig, *, progress: bool = True) -> Path:
    """Run every planned run that ``<out>/results.jsonl`` does not hold yet; returns the results path."""
    if config.threads:
        torch.set_num_threads(config.threads)
    device = ac.resolve_device(config.device)
    results = Path(config.out) / RESULTS
    done = {run_key(r) for r in _check_results_protocol(results, config)}
    planned = planned_runs(config)
    todo = [run for run in planned if run not in done]
    data, sigma = None, None
    bar = ac.progress(todo, desc=f"layer-fit ({len(planned) - len(todo)} done before)", disable=not progress)
    for activation, method, budget, seed in bar:
        if data is None or data.activation != activation:
            data = make_data(
                activation,
                samples=config.samples,
                dim=config.dim,
                seed=config.data_seed,
                center=config.center,
                device=device,
            )
            sigma = singular_values(data.y)
        checkpoint = Path(config.out) / "checkpoints" / f"{run_name(activation, method, budget, seed)}.pt"
        record = fit_one(
            data,
            method,
            budget,
            seed,
            config,
            device=device,
            checkpoint=checkpoint,
            progress=progress,
            sigma=sigma,
        )
        ac.append_jsonl(results, record)
        bar.set_postfix(last=f"{activation}/{method}/{budget}: {record['mse']}")
    return results
