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
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

import lra_data
from app_common.distributed import Distributed, evaluation_sums
from app_common.harness import TrainData, Trainer
from app_common.results import read_jsonl
from app_common.run import Run
from app_common.schedules import param_groups, schedule
from lra_bench.config import TrainConfig, run_label
from lra_bench.model import LRAClassifier


def _truncate(tokens: torch.Tensor | tuple, max_length: int):
    if isinstance(tokens, tuple | list):
        return tuple(t[:max_length] for t in tokens)
    return tokens[:max_length]


def collate(items: list[tuple], *, max_length: int) -> lra_data.Batch | lra_data.PairBatch:
    """[`lra_data.collate`][lra_data.collate] after cutting every document to ``max_length`` tokens."""
    return lra_data.collate([(_truncate(tokens, max_length), label) for tokens, label in items])


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    dataset: lra_data.LRADataset,
    config: TrainConfig,
    dist: Distributed,
    *,
    max_batches: int = 0,
) -> float:
    """Accuracy over the first ``max_batches`` batches of ``dataset`` in order (0: all of it).

    Each process evaluates its share of every batch; the counts are summed over processes.
    """
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

    def counts(batch: tuple[torch.Tensor, ...], forward: Callable[..., torch.Tensor]) -> torch.Tensor:
        *inputs, labels = (t.to(dist.device) for t in batch)
        correct = (forward(*inputs).argmax(dim=-1) == labels).sum()
        return torch.stack(
            [correct.double(), torch.tensor(labels.numel(), dtype=torch.float64, device=labels.device)]
        )

    totals = evaluation_sums(model, loader, counts, size=2, device=dist.device, dtype=config.dtype)
    return (totals[0] / totals[1]).item()


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


class BestWeights:
    """Early stopping's state: the best validation accuracy, its step and weights (a checkpoint part)."""

    def __init__(self, model: nn.Module) -> None:
        self.accuracy, self.step, self.evals_since = -1.0, 0, 0
        self.weights: dict[str, Any] = _cpu_copy(model.state_dict())

    def update(self, model: nn.Module, accuracy: float, step: int) -> None:
        """Keep ``model``'s weights if ``accuracy`` beats the best, else count one evaluation without gain."""
        if accuracy > self.accuracy:
            self.accuracy, self.step, self.evals_since = accuracy, step, 0
            self.weights = _cpu_copy(model.state_dict())
        else:
            self.evals_since += 1

    def state_dict(self) -> dict[str, Any]:
        """The state a checkpoint carries."""
        return {
            "accuracy": self.accuracy,
            "step": self.step,
            "evals_since": self.evals_since,
            "weights": self.weights,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict`'s state."""
        self.accuracy, self.step, self.evals_since = state["accuracy"], state["step"], state["evals_since"]
        self.weights = state["weights"]


def _model(config: TrainConfig, dataset: lra_data.LRADataset) -> LRAClassifier:
    """The model of Table 6 for ``config`` on ``dataset``'s vocabulary and classes."""
    return LRAClassifier(
        config.model,
        vocab_size=dataset.vocab_size,
        num_classes=dataset.num_classes,
        pair=dataset.pair,
        max_length=config.max_length,
        seed=config.seed,
    )


def train(config: TrainConfig, *, on_checkpoint: Callable[[int], None] | None = None) -> dict | None:
    """Train one run (resuming its checkpoint unless ``config.resume`` is off) and append its record.

    Returns the record, or None when the run finished earlier. Works alone or in every process that
    ``torchrun`` started (DistributedDataParallel). The record goes to ``<out>/results.jsonl`` and
    ``<out>/runs/<run_name>/record.json``, the checkpoint and log to ``<out>/runs/<run_name>/``
    (``app_common.harness.Trainer``).

    Args:
        config: the run (Table 6 already filled in).
        on_checkpoint: called with the step after every checkpoint is written (progress hooks; an
            exception raised there stops the run as a kill would, with the checkpoint on disk).

    Raises:
        ValueError: bad settings, data or checkpoint (each names what is wrong).
        FileNotFoundError: no cache for the task under ``config.data``.
    """
    run = Run.from_config(config, label=run_label(config), on_save=on_checkpoint)
    return run.unless_finished(lambda run: _train(config, run))


def _train(config: TrainConfig, run: Run) -> dict:
    """Build the model of Table 6, train it through the harness, test the best weights, write the record."""
    dist = run.dist
    train_set = lra_data.load(config.task, "train", config.data)
    val_set, val_split = _validation_split(config)
    test_set = lra_data.load(config.task, "test", config.data)
    model = _model(config, train_set).to(run.device)
    optimizer = torch.optim.AdamW(
        param_groups(model, config.weight_decay), lr=config.lr, betas=(0.9, 0.999), eps=1e-6
    )
    best = BestWeights(model)
    trainer = Trainer.from_config(
        config,
        run,
        model,
        optimizer,
        schedule=schedule("linear", config.warmup_steps, config.steps),
        state={"best": best},
        compile=config.compile,
    )

    def loss(step: int, batch: Any) -> torch.Tensor:
        *inputs, labels = (t.to(run.device, non_blocking=True) for t in batch)
        return F.cross_entropy(trainer.forward(*inputs).float(), labels)

    def validate(step: int) -> dict[str, float]:
        accuracy = evaluate(model, val_set, config, dist, max_batches=config.eval_batches)
        best.update(model, accuracy, step)
        if best.evals_since >= config.patience and step >= config.init_steps:
            trainer.stop("early_stopping")
        return {f"{val_split}_accuracy": accuracy}

    data = TrainData(
        train_set, config.batch_size, functools.partial(collate, max_length=config.max_length), config.workers
    )
    trainer.fit(loss, data=data, evaluate=validate)
    model.load_state_dict(best.weights)
    test_accuracy = evaluate(model, test_set, config, dist)
    record = trainer.record(
        config,
        metrics={"test_accuracy": test_accuracy, "val_accuracy": best.accuracy},
        details={
            "task": config.task,
            "attention": config.model.attention,
            "features": config.model.attention_features,
            "val_split": val_split,
            "best_step": best.step,
            "attention_dropout_applied": model.attention_dropout_applied,
        },
    )
    record["stopped"] = trainer.stopped or "max_steps"
    if run.is_main:
        print(
            f"{run.name}: test accuracy {test_accuracy:.4f} (best val {best.accuracy:.4f} at step "
            f"{best.step}), {trainer.step} steps, {trainer.train_seconds:.1f} s"
        )
    return trainer.finish(record)


def evaluate_so_far(config: TrainConfig) -> dict[str, Any]:
    """The unfinished run of ``config`` tested now: its best weights so far on the whole test split.

    Reads the run's last checkpoint (written at every evaluation) and changes nothing in the run's folder;
    the run continues as before. Returns the run's name, its step, the best validation accuracy, its step,
    the test accuracy of those weights, the training time so far and the validation curve (``[step,
    accuracy]`` pairs from the run's log).

    Raises:
        FileNotFoundError: the run has no checkpoint (not started, or finished: its record holds the result).
    """
    run = Run.from_config(config, label=run_label(config))
    state = run.checkpointer.load(map_location=run.device)
    if state is None:
        raise FileNotFoundError(f"{run.dir}: no checkpoint (the run has not reached its first evaluation)")
    test_set = lra_data.load(config.task, "test", config.data)
    model = _model(config, test_set).to(run.device)
    best = state["state"]["best"]
    model.load_state_dict(best["weights"])
    curve = [
        [line["step"], line["val_accuracy"]] for line in read_jsonl(run.log_path) if "val_accuracy" in line
    ]
    return {
        "run": run.name,
        "task": config.task,
        "attention": config.model.attention,
        "features": config.model.attention_features,
        "step": int(state["step"]),
        "best_step": int(best["step"]),
        "val_accuracy": float(best["accuracy"]),
        "test_accuracy": evaluate(model, test_set, config, run.dist),
        "train_seconds": float(state["counters"]["train_seconds"]),
        "curve": curve,
    }
