"""Training: one run (method, activation, budget, seed) and the resumable grid of runs.

Each run is full-batch Adam on the MSE between the model's output and the standardized targets, with a
cosine learning-rate decay to 0 over ``steps`` and the gradient norm clipped at ``clip``; the reported
figure is the train MSE of the final model (evaluated once more after the last step). Finished runs are
one JSON line each in ``<out>/results.jsonl``; a run in progress checkpoints every ``checkpoint_every``
steps to ``<out>/checkpoints/`` and resumes from there.
"""

from __future__ import annotations

import itertools
import math
import platform
from pathlib import Path

import torch
import torch.nn.functional as F

import app_common as ac
from layer_fit.config import FitConfig
from layer_fit.data import LayerData, make_data
from layer_fit.methods import METHODS, build

#: The record fields that make two runs comparable (see `FitConfig.protocol`).
PROTOCOL_KEYS = tuple(FitConfig().protocol())


def run_key(record: dict) -> tuple:
    """What identifies a run: ``(activation, method, budget, seed)`` plus the protocol settings."""
    protocol = tuple((k, record[k]) for k in PROTOCOL_KEYS)
    return (record["activation"], record["method"], int(record["budget"]), int(record["seed"]), protocol)


def _run_name(activation: str, method: str, budget: int, seed: int) -> str:
    return f"{activation}-{method}-b{budget}-s{seed}"


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
) -> dict:
    """Train ``method`` at ``budget`` with ``seed`` on ``data``; returns the run's record (no file written).

    Args:
        data: standardized inputs and targets on ``device``.
        method: a name in [`layer_fit.METHODS`][layer_fit.METHODS].
        budget: the feature budget (rank for ``lowrank``/``linear``).
        seed: seed of the initial dense layer and of the method's random projections.
        config: the protocol (steps, lr, clip, output_affine, checkpoint_every, log_every).
        device: where the model lives.
        checkpoint: a checkpoint path: resumed from when it holds this run, written every
            ``config.checkpoint_every`` steps, removed when the run finishes.
        progress: draw a step bar.
    """
    sample = data.x[: min(len(data.x), 4096)]
    model = build(
        method,
        data.activation,
        budget,
        dim=data.x.shape[-1],
        seed=seed,
        sample=sample,
        output_affine=config.output_affine,
        device=device,
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config.steps)
    name = _run_name(data.activation, method, budget, seed)
    identity = {"run": name, **config.protocol()}
    curve: list[list[float]] = []
    start, seconds = 0, 0.0
    state = ac.load_checkpoint(checkpoint, map_location=device) if checkpoint is not None else None
    if state is not None and state.get("identity") == identity:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        start, seconds, curve = state["step"], state["seconds"], state["curve"]

    def loss_now() -> torch.Tensor:
        return F.mse_loss(model(data.x).float(), data.y.float())

    with torch.no_grad():
        initial = float(loss_now()) if start == 0 else state["initial"]
    diverged_at = None
    timer = ac.Timer(device, elapsed=seconds)
    bar = ac.progress(
        range(start, config.steps),
        total=config.steps,
        initial=start,
        desc=name,
        leave=False,
        disable=not progress,
    )
    model.train()
    for step in bar:
        timer.start()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_now()
        if not torch.isfinite(loss):
            timer.stop()
            diverged_at = step
            break
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip)
        optimizer.step()
        schedule.step()
        timer.stop()
        if step % config.log_every == 0:
            value = loss.item()
            curve.append([step, value])
            bar.set_postfix(mse=f"{value:.4g}")
        done = step + 1
        every = config.checkpoint_every
        if checkpoint is not None and every and done % every == 0 and done < config.steps:
            ac.save_checkpoint(
                checkpoint,
                {
                    "identity": identity,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "schedule": schedule.state_dict(),
                    "step": done,
                    "seconds": timer.elapsed,
                    "curve": curve,
                    "initial": initial,
                },
            )
    bar.close()
    model.eval()
    with torch.no_grad():
        final = float(loss_now()) if diverged_at is None else math.nan
    if not math.isfinite(final) and diverged_at is None:
        diverged_at = config.steps
    layer = model.layer
    record = {
        "activation": data.activation,
        "method": method,
        "budget": budget,
        "seed": seed,
        **config.protocol(),
        "mse": final if math.isfinite(final) else None,
        "mse_init": initial if math.isfinite(initial) else None,
        "diverged": diverged_at is not None,
        "diverged_at_step": diverged_at,
        "num_random_features": int(getattr(layer, "num_random_features", budget)),
        "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "train_seconds": timer.elapsed,
        "curve": curve,
        "device": str(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
    }
    if checkpoint is not None:
        checkpoint.unlink(missing_ok=True)
    return record


def planned_runs(config: FitConfig) -> list[tuple[str, str, int, int]]:
    """Every ``(activation, method, budget, seed)`` of the grid, activation-major (one dataset at a time)."""
    for method in config.methods:
        METHODS.get(method)  # unknown names fail before any run
    seeds = range(config.first_seed, config.first_seed + config.seeds)
    return list(itertools.product(config.activations, config.methods, config.budgets, seeds))


def run_fit(config: FitConfig, *, progress: bool = True) -> Path:
    """Run every planned run that ``<out>/results.jsonl`` does not hold yet; returns the results path."""
    if config.threads:
        torch.set_num_threads(config.threads)
    device = ac.resolve_device(config.device)
    results = Path(config.out) / "results.jsonl"
    protocol = config.protocol()
    done = {run_key(r) for r in ac.read_jsonl(results, missing_ok=True)}
    todo = [
        run
        for run in planned_runs(config)
        if run_key(dict(zip(("activation", "method", "budget", "seed"), run, strict=True), **protocol))
        not in done
    ]
    skipped = len(planned_runs(config)) - len(todo)
    data = None
    bar = ac.progress(todo, desc=f"layer-fit ({skipped} done before)", disable=not progress)
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
        checkpoint = Path(config.out) / "checkpoints" / f"{_run_name(activation, method, budget, seed)}.pt"
        record = fit_one(
            data, method, budget, seed, config, device=device, checkpoint=checkpoint, progress=progress
        )
        ac.append_jsonl(results, record)
        bar.set_postfix(last=f"{activation}/{method}/{budget}: {record['mse']}")
    return results
