"""``lra-bench train``: one run with early stopping, checkpoints at every evaluation, and the test result.

The loop, top-down: load the cache, build the model of Table 6, AdamW with linear warm-up and linear
decay, then step; every ``eval_frequency`` steps measure validation accuracy, keep the best weights,
save a checkpoint, and stop once ``patience`` evaluations in a row bring no improvement (never before
``init_steps``). The best weights are evaluated on the test split and one JSON line is appended to the
results file.

Reproducible by construction: the batch of step ``t`` depends only on ``(seed, t)`` (a fresh permutation
per epoch), and a checkpoint holds the model, optimizer, schedule, best weights, counters and every random
state, so ``--resume`` continues a killed run to the same weights and the same result. Under ``torchrun``
each of ``N`` processes takes ``batch_size / N`` examples of the same global batch and DDP averages the
gradients, which gives the one-process trajectory.
"""

from __future__ import annotations

import functools
import math
import platform
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Sampler

import app_common as ac
import lra_data
from lra_bench.config import TrainConfig, run_name
from lra_bench.model import LRAClassifier

CHECKPOINT = "checkpoint.pt"
LOG = "log.jsonl"


class StepBatches(Sampler[list[int]]):
    """Index lists of the training batches from step ``start_step`` on, forever.

    The global batch of step ``t`` is slice ``t mod E`` of a permutation drawn for epoch ``t // E``
    (``E = n // batch_size`` batches per epoch, the remainder dropped) from a generator seeded with
    ``(seed, epoch)``; process ``rank`` of ``world_size`` takes its contiguous share of it.
    """

    def __init__(
        self, n: int, batch_size: int, *, seed: int, start_step: int = 0, rank: int = 0, world_size: int = 1
    ) -> None:
        if batch_size > n:
            raise ValueError(f"batch_size: {batch_size} is larger than the training split ({n} examples)")
        if batch_size % world_size:
            raise ValueError(f"batch_size: {batch_size} is not divisible by the {world_size} processes")
        self.n, self.batch_size, self.seed, self.start_step = n, batch_size, seed, start_step
        self.rank, self.world_size = rank, world_size

    def __iter__(self) -> Iterator[list[int]]:
        per_epoch = self.n // self.batch_size
        local = self.batch_size // self.world_size
        epoch, order = -1, None
        step = self.start_step
        while True:
            e, i = divmod(step, per_epoch)
            if e != epoch:
                generator = torch.Generator().manual_seed(1_000_003 * self.seed + e)
                epoch, order = e, torch.randperm(self.n, generator=generator)
            batch = order[i * self.batch_size : (i + 1) * self.batch_size]
            yield batch[self.rank * local : (self.rank + 1) * local].tolist()
            step += 1


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


def _rewind_log(path: Path, step: int) -> None:
    """Drop the log lines written after ``step`` (by a run killed after its last checkpoint)."""
    kept = [r for r in ac.read_jsonl(path, missing_ok=True) if r["step"] <= step]
    path.unlink(missing_ok=True)
    for record in kept:
        ac.append_jsonl(path, record)


def _cpu_copy(state):
    """A copy of a state dict on the CPU (tensors cloned; modules' extra states copied as they are)."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return type(state)((k, _cpu_copy(v)) for k, v in state.items())
    if isinstance(state, list | tuple):
        return type(state)(_cpu_copy(v) for v in state)
    return state


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def train(config: TrainConfig, *, on_checkpoint: Callable[[int], None] | None = None) -> dict | None:
    """Train one run (resuming its checkpoint if ``config.resume``) and append its record to the results.

    Returns the record, or None when the checkpoint says the run already finished.

    Works alone or in every process that ``torchrun`` started (DistributedDataParallel).

    Args:
        config: the run; per-task fields left at None come from Table 6.
        on_checkpoint: called with the step after every checkpoint is written (progress hooks; an
            exception raised there stops the run as a kill would, with the checkpoint on disk).

    Raises:
        ValueError: bad settings, data or checkpoint (each names what is wrong).
        FileNotFoundError: no cache for the task under ``config.data``.
    """
    config = config.resolved()
    if config.threads:
        torch.set_num_threads(config.threads)
    dist = ac.setup_distributed(config.device)
    record = _train(config, dist, on_checkpoint)
    ac.teardown_distributed()
    return record


def _train(config: TrainConfig, dist: ac.Distributed, on_checkpoint) -> dict | None:
    device, name = dist.device, run_name(config)
    run_dir = Path(config.runs) / name
    train_set = lra_data.load(config.task, "train", config.data)
    val_set, val_split = _validation_split(config)
    test_set = lra_data.load(config.task, "test", config.data)

    ac.seed_everything(config.seed)
    model = LRAClassifier(
        config, vocab_size=train_set.vocab_size, num_classes=train_set.num_classes, pair=train_set.pair
    ).to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=config.learning_rate,
        betas=(0.9, 0.999),
        eps=1e-6,
        weight_decay=config.weight_decay,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, linear_warmup_decay(config.warmup_steps, config.max_steps)
    )
    ac.seed_everything(config.seed * 7919 + 17 + dist.rank)  # dropout streams, one per process

    state = {
        "step": 0,
        "best_accuracy": -1.0,
        "best_step": 0,
        "evals_since_best": 0,
        "train_time": 0.0,
        "stopped": None,
        "finished": False,
    }
    best_model = _cpu_copy(model.state_dict())
    checkpoint = ac.load_checkpoint(run_dir / CHECKPOINT) if config.resume else None
    if checkpoint is not None:
        if checkpoint["run"] != name:
            raise ValueError(f"{run_dir / CHECKPOINT}: holds run {checkpoint['run']!r}, expected {name!r}")
        if len(checkpoint["rng"]) != dist.world_size:
            raise ValueError(
                f"{run_dir / CHECKPOINT}: saved by {len(checkpoint['rng'])} processes; resume it with as "
                f"many (now {dist.world_size})"
            )
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        best_model = checkpoint["best_model"]
        state.update(checkpoint["state"])
        ac.set_rng_state(checkpoint["rng"][dist.rank])
        if state["finished"]:
            if dist.is_main:
                print(f"{name}: finished earlier (see {config.results}); nothing to do")
            return None
        if dist.is_main:
            print(f"{name}: resuming at step {state['step']} from {run_dir / CHECKPOINT}")
            _rewind_log(run_dir / LOG, state["step"])
    elif dist.is_main:
        (run_dir / LOG).unlink(missing_ok=True)
    ac.barrier()

    wrapped = model
    if dist.enabled:
        wrapped = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    forward = torch.compile(wrapped) if config.compile else wrapped
    loader = DataLoader(
        train_set,
        batch_sampler=StepBatches(
            len(train_set),
            config.batch_size,
            seed=config.seed,
            start_step=state["step"],
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

    def save(finished: bool = False) -> None:
        rng = ac.all_gather_object(ac.rng_state())
        if dist.is_main:
            ac.save_checkpoint(
                run_dir / CHECKPOINT,
                {
                    "run": name,
                    "config": ac.config_dict(config),
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "best_model": best_model,
                    "state": {**state, "finished": finished},
                    "rng": rng,
                },
            )
        ac.barrier()

    ac.reset_peak_memory(device)
    timer = ac.Timer(device, elapsed=state["train_time"])
    bar = ac.progress(total=config.max_steps, initial=state["step"], desc=name, disable=not dist.is_main)
    loss_sum = torch.zeros((), device=device)
    losses_in_window = 0
    model.train()
    timer.start()
    # A run killed after its last checkpoint but before the test has nothing left to train.
    for batch in loader if state["stopped"] is None else ():
        *inputs, labels = (t.to(device, non_blocking=True) for t in batch)
        with ac.autocast(device, config.dtype):
            logits = forward(*inputs)
        loss = F.cross_entropy(logits.float(), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip > 0:
            torch.nn.utils.clip_grad_value_(model.parameters(), config.grad_clip)
        optimizer.step()
        scheduler.step()
        state["step"] += 1
        step = state["step"]
        loss_sum += loss.detach()
        losses_in_window += 1
        bar.update(1)

        if step % config.log_every == 0 or step == config.max_steps:
            mean_loss = ac.all_reduce(loss_sum / losses_in_window, "mean").item()
            loss_sum.zero_()
            losses_in_window = 0
            bar.set_postfix(loss=f"{mean_loss:.4f}", best=f"{max(state['best_accuracy'], 0):.3f}")
            if dist.is_main:
                ac.append_jsonl(
                    run_dir / LOG, {"step": step, "train_loss": mean_loss, "lr": scheduler.get_last_lr()[0]}
                )

        if step % config.eval_frequency == 0 or step == config.max_steps:
            accuracy = evaluate(model, val_set, config, dist, max_batches=config.eval_steps)
            if accuracy > state["best_accuracy"]:
                state.update(best_accuracy=accuracy, best_step=step, evals_since_best=0)
                best_model = _cpu_copy(model.state_dict())
            else:
                state["evals_since_best"] += 1
            if state["evals_since_best"] >= config.patience and step >= config.init_steps:
                state["stopped"] = "early_stopping"
            if step == config.max_steps and state["stopped"] is None:
                state["stopped"] = "max_steps"
            if dist.is_main:
                ac.append_jsonl(run_dir / LOG, {"step": step, f"{val_split}_accuracy": accuracy})
            state["train_time"] = timer.stop()
            save()
            if on_checkpoint is not None:
                on_checkpoint(step)
            if state["stopped"]:
                break
            timer.start()
    bar.close()

    peak = ac.peak_memory(device)
    peak_bytes = int(ac.all_reduce(torch.tensor([float(peak.bytes)], device=device), "max").item())
    model.load_state_dict(best_model)
    test_accuracy = evaluate(model, test_set, config, dist)
    record = {
        "run": name,
        "task": config.task,
        "attention": config.attention,
        "features": config.features,
        "seed": config.seed,
        "test_accuracy": test_accuracy,
        "val_accuracy": state["best_accuracy"],
        "val_split": val_split,
        "best_step": state["best_step"],
        "steps": state["step"],
        "stopped": state["stopped"],
        "train_time_s": state["train_time"],
        "peak_memory_bytes": peak_bytes,
        "memory_kind": peak.kind,
        "device": _device_name(device),
        "world_size": dist.world_size,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "attention_dropout_applied": model.attention_dropout_applied,
        "torch": torch.__version__,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": ac.config_dict(config),
    }
    if dist.is_main:
        ac.append_jsonl(config.results, record)
        print(
            f"{name}: test accuracy {test_accuracy:.4f} (best val {state['best_accuracy']:.4f} at step "
            f"{state['best_step']}), {state['step']} steps, {state['train_time']:.1f} s"
        )
    save(finished=True)
    return record
