"""``lra-bench train``: one run with early stopping, checkpoints at every evaluation, and the test result.

The loop, top-down: load the cache, build the model of Table 6, AdamW with linear warm-up and linear
decay, then step (the gradient norm clipped at ``grad_clip``); every ``eval_every`` steps measure
validation accuracy, keep the best weights,
save a checkpoint, and stop once ``patience`` evaluations in a row bring no improvement (never before
``init_steps``). The best weights are evaluated on the test split and one JSON line is appended to the
results file.

Reproducible by construction: the batch of step ``t`` depends only on ``(seed, t)`` (a fresh permutation
per epoch), and a checkpoint holds the model, optimizer, schedule, best weights, counters and every random
state, so ``--resume`` (the default) continues a killed run to the same weights and the same result.
Under ``torchrun`` each of ``N`` processes takes ``batch_size / N`` examples of the same global batch
and DDP averages the gradients, which gives the one-process trajectory.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

import app_common as ac
import lra_data
from lra_bench.config import TrainConfig, run_name
from lra_bench.model import LRAClassifier

CHECKPOINT = "checkpoint.pt"
LOG = "log.jsonl"
RESULTS = "results.jsonl"


def _truncate(tokens: torch.Tensor | tuple, max_length: int):
    if isinstance(tokens, tuple | list):
        return tuple(t[:max_length] for t in tokens)
    return tokens[:max_length]


def collate(items: list[tuple], *, max_length: int) -> lra_data.Batch | lra_data.PairBatch:
    """[`lra_data.collate`][lra_data.collate] after cutting every document to ``max_length`` tokens."""
    return lra_data.collate([(_truncate(tokens, max_length), label) for tokens, label in items])


def linear_warmup_decay(warmup_steps: int, max_steps: int) -> Callable[[int], float]:
    """Learning-rate factor of step ``t``: linear up to 1 over ``warmup_steps``, then linear to 0."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (max_steps - step) / max(1, max_steps - warmup_steps))

    return factor


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    dataset: lra_data.LRADataset,
    config: TrainConfig,
    dist: ac.Distributed,
    *,
    max_batches: int = 0,
) -> float:
    """Accuracy over the first ``max_batches`` batches of ``dataset`` in order (0: all of it).

    Each process evaluates its share of every batch; the counts are summed over processes.
    """
    was_training = model.training
    model.eval()
    n = len(dataset)
    batches = math.ceil(n / config.batch_size)
    if max_batches:
        batches = min(batches, max_batches)
    shares = [
        list(range(b * config.batch_size, min((b + 1) * config.batch_size, n)))[dist.rank :: dist.world_size]
        for b in range(batches)
    ]
    loader = DataLoader(
        dataset,
        batch_sampler=[s for s in shares if s],
        collate_fn=functools.partial(collate, max_length=config.max_length),
        num_workers=config.workers,
        generator=torch.Generator(),  # DataLoader iterators draw a seed: not from the global stream
    )
    counts = torch.zeros(2, dtype=torch.float64, device=dist.device)
    for batch in loader:
        *inputs, labels = (t.to(dist.device) for t in batch)
        with ac.autocast(dist.device, config.dtype):
            logits = model(*inputs)
        counts[0] += (logits.argmax(dim=-1) == labels).sum()
        counts[1] += labels.numel()
    ac.all_reduce(counts, "sum")
    model.train(was_training)
    return (counts[0] / counts[1]).item()


def _validation_split(config: TrainConfig) -> tuple[lra_data.LRADataset, str]:
    """The validation split, or the test split for tasks without one (Text, as the LRA does)."""
    try:
        return lra_data.load(config.task, "val", config.data), "val"
    except ValueError as error:
        if "is not in the cache" not in str(error):
            raise
        return lra_data.load(config.task, "test", config.data), "test"


def _cpu_copy(state):
    """A copy of a state dict on the CPU (tensors cloned; modules' extra states copied as they are)."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return type(state)((k, _cpu_copy(v)) for k, v in state.items())
    if isinstance(state, list | tuple):
        return type(state)(_cpu_copy(v) for v in state)
    return state


def train(config: TrainConfig, *, on_checkpoint: Callable[[int], None] | None = None) -> dict | None:
    """Train one run (resuming its checkpoint unless ``config.resume`` is off) and append its record.

    Returns the record, or None when the checkpoint says the run already finished. Works alone or in
    every process that ``torchrun`` started (DistributedDataParallel). The record goes to
    ``<out>/results.jsonl``, the checkpoint and log to ``<out>/runs/<run_name>/``.

    Args:
        config: the run (Table 6 already filled in).
        on_checkpoint: called with the step after every checkpoint is written (progress hooks; an
            exception raised there stops the run as a kill would, with the checkpoint on disk).

    Raises:
        ValueError: bad settings, data or checkpoint (each names what is wrong).
        FileNotFoundError: no cache for the task under ``config.data``.
    """
    if config.threads:
        torch.set_num_threads(config.threads)
    dist = ac.setup_distributed(config.device)
    try:
        return _train(config, dist, on_checkpoint)
    finally:
        ac.teardown_distributed()


@dataclass
class Progress:
    """The counters a checkpoint carries besides the weights, optimizer and random states."""

    step: int = 0
    best_accuracy: float = -1.0
    best_step: int = 0
    evals_since_best: int = 0
    train_time: float = 0.0
    stopped: str | None = None
    finished: bool = False
    best_model: dict[str, Any] = field(default_factory=dict)


def _train(config: TrainConfig, dist: ac.Distributed, on_checkpoint) -> dict | None:
    device, name = dist.device, run_name(config)
    run_dir = Path(config.out) / "runs" / name
    train_set = lra_data.load(config.task, "train", config.data)
    val_set, val_split = _validation_split(config)
    test_set = lra_data.load(config.task, "test", config.data)

    ac.seed_everything(config.seed)
    model = LRAClassifier(
        config.model,
        vocab_size=train_set.vocab_size,
        num_classes=train_set.num_classes,
        pair=train_set.pair,
        max_length=config.max_length,
        seed=config.seed,
    ).to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=config.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, linear_warmup_decay(config.warmup_steps, config.steps)
    )
    ac.seed_everything(config.seed * 7919 + 17 + dist.rank)  # dropout streams, one per process

    checkpointer = ac.Checkpointer(
        run_dir / CHECKPOINT, ac.run_identity(config), resume=config.resume, on_save=on_checkpoint
    )
    progress = _restore(checkpointer, dist, model=model, optimizer=optimizer, scheduler=scheduler)
    if progress.finished:
        if dist.is_main:
            print(f"{name}: finished earlier (see {Path(config.out) / RESULTS}); nothing to do")
        return None
    if dist.is_main:
        if progress.step:
            print(f"{name}: resuming at step {progress.step} from {checkpointer.path}")
            ac.rewind_log(run_dir / LOG, progress.step)
        else:
            (run_dir / LOG).unlink(missing_ok=True)
    ac.barrier()

    def save(finished: bool = False) -> None:
        rng = ac.all_gather_object(ac.rng_state())
        counters = {**vars(progress), "finished": finished}
        parts = ac.state_dicts(model=model, optimizer=optimizer, scheduler=scheduler)
        checkpointer.save(progress.step, {**parts, "progress": counters, "rng": rng}, write=dist.is_main)
        ac.barrier()

    ac.reset_peak_memory(device)
    # A run killed after its last checkpoint but before the test has nothing left to train.
    if progress.stopped is None:
        _loop(config, dist, model, optimizer, scheduler, train_set, val_set, val_split, progress, save, name)
    return _test(config, dist, model, test_set, val_split, progress, save, name)


def _restore(checkpointer: ac.Checkpointer, dist: ac.Distributed, **parts) -> Progress:
    """The counters of the checkpoint (its weights, optimizer, scheduler, random state loaded), or fresh."""
    state = checkpointer.load()
    if state is None:
        model = parts["model"]
        return Progress(best_model=_cpu_copy(model.state_dict()))
    if len(state["rng"]) != dist.world_size:
        raise ValueError(
            f"{checkpointer.path}: saved by {len(state['rng'])} processes; resume it with as many "
            f"(now {dist.world_size})"
        )
    ac.load_state_dicts(state, **parts)
    ac.set_rng_state(state["rng"][dist.rank])
    return Progress(**state["progress"])


def _loop(config, dist, model, optimizer, scheduler, train_set, val_set, val_split, progress, save, name):
    """Step until the step budget or early stopping; evaluate, keep the best weights and checkpoint."""
    device = dist.device
    run_dir = Path(config.out) / "runs" / name
    wrapped = model
    if dist.enabled:
        wrapped = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    forward = torch.compile(wrapped) if config.compile else wrapped
    loader = DataLoader(
        train_set,
        batch_sampler=ac.StepBatches(
            len(train_set),
            config.batch_size,
            seed=config.seed,
            start_step=progress.step,
            rank=dist.rank,
            world_size=dist.world_size,
        ),
        collate_fn=functools.partial(collate, max_length=config.max_length),
        num_workers=config.workers,
        pin_memory=device.type == "cuda",
        # Creating the iterator draws a seed; from its own generator, so that the global stream (dropout)
        # is the same whether the loop starts fresh or resumes from a checkpoint.
        generator=torch.Generator().manual_seed(config.seed),
    )
    timer = ac.Timer(device, elapsed=progress.train_time)
    bar = ac.progress(total=config.steps, initial=progress.step, desc=name, disable=not dist.is_main)
    loss_sum, losses_in_window = torch.zeros((), device=device), 0
    model.train()
    timer.start()
    for batch in loader:
        *inputs, labels = (t.to(device, non_blocking=True) for t in batch)
        with ac.autocast(device, config.dtype):
            logits = forward(*inputs)
        loss = F.cross_entropy(logits.float(), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        scheduler.step()
        progress.step += 1
        step = progress.step
        loss_sum += loss.detach()
        losses_in_window += 1
        bar.update(1)

        if step % config.log_every == 0 or step == config.steps:
            mean_loss = ac.all_reduce(loss_sum / losses_in_window, "mean").item()
            loss_sum.zero_()
            losses_in_window = 0
            bar.set_postfix(loss=f"{mean_loss:.4f}", best=f"{max(progress.best_accuracy, 0):.3f}")
            if dist.is_main:
                ac.append_jsonl(
                    run_dir / LOG, {"step": step, "train_loss": mean_loss, "lr": scheduler.get_last_lr()[0]}
                )

        if step % config.eval_every == 0 or step == config.steps:
            accuracy = evaluate(model, val_set, config, dist, max_batches=config.eval_steps)
            _update_progress(progress, model, accuracy, config)
            if dist.is_main:
                ac.append_jsonl(run_dir / LOG, {"step": step, f"{val_split}_accuracy": accuracy})
            progress.train_time = timer.stop()
            save()
            if progress.stopped:
                break
            timer.start()
    bar.close()


def _update_progress(progress: Progress, model: nn.Module, accuracy: float, config: TrainConfig) -> None:
    """Keep the best weights; stop after ``patience`` evaluations without gain (not before ``init_steps``)."""
    if accuracy > progress.best_accuracy:
        progress.best_accuracy, progress.best_step, progress.evals_since_best = accuracy, progress.step, 0
        progress.best_model = _cpu_copy(model.state_dict())
    else:
        progress.evals_since_best += 1
    if progress.evals_since_best >= config.patience and progress.step >= config.init_steps:
        progress.stopped = "early_stopping"
    if progress.step == config.steps and progress.stopped is None:
        progress.stopped = "max_steps"


def _test(config, dist, model, test_set, val_split, progress, save, name) -> dict:
    """Evaluate the best weights on the test split, append the run's record, mark the run finished."""
    device = dist.device
    peak = ac.peak_memory(device)
    peak_bytes = int(ac.all_reduce(torch.tensor([float(peak.bytes)], device=device), "max").item())
    model.load_state_dict(progress.best_model)
    test_accuracy = evaluate(model, test_set, config, dist)
    record = {
        "run": name,
        "task": config.task,
        "attention": config.model.attention,
        "features": config.model.attention_features,
        "seed": config.seed,
        "test_accuracy": test_accuracy,
        "val_accuracy": progress.best_accuracy,
        "val_split": val_split,
        "best_step": progress.best_step,
        "steps": progress.step,
        "stopped": progress.stopped,
        "train_time_s": progress.train_time,
        "peak_memory_bytes": peak_bytes,
        "memory_kind": peak.kind,
        "device": ac.device_name(device),
        "world_size": dist.world_size,
        "num_parameters": ac.count_parameters(model, trainable=False),
        "attention_dropout_applied": model.attention_dropout_applied,
        "torch": torch.__version__,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": ac.config_dict(config),
    }
    if dist.is_main:
        ac.append_jsonl(Path(config.out) / RESULTS, record)
        print(
            f"{name}: test accuracy {test_accuracy:.4f} (best val {progress.best_accuracy:.4f} at step "
            f"{progress.best_step}), {progress.step} steps, {progress.train_time:.1f} s"
        )
    save(finished=True)
    return record
