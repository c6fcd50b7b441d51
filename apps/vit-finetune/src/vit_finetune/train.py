"""``vit-finetune train``: one fine-tuning run, its checkpoints, and its record (accuracy, size, throughput).

Top-down: read the data, build the (pretrained) ViT, replace the MLPs of the last k blocks (and their
attention with ``--attention``), then AdamW steps under the one-cycle schedule with gradient-norm clipping;
every ``eval_every`` steps the evaluation split's accuracy goes to the run's log and a checkpoint is saved.
At the end the model is evaluated once more and timed for inference against the dense model built in the
same process (and against its compressed form, ``fc2`` folded into each linearized ``fc1``), and one JSON
line is appended to the results file.

The batch of step ``t`` depends only on ``(seed, t)``, and a checkpoint holds the model, optimizer, schedule,
counters and random states, so a killed run resumes (the default) to the same weights.
"""

from __future__ import annotations

import dataclasses
import math
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler

import app_common as ac
from vit_finetune import data as vdata
from vit_finetune.config import TrainConfig, run_name
from vit_finetune.surgery import compressed, count_parameters, replace_mlps, swap_attention
from vit_finetune.weights import MODELS, ModelSpec, build_model

CHECKPOINT = "checkpoint.pt"
LOG = "log.jsonl"


class StepBatches(Sampler[list[int]]):
    """Index lists of the training batches of steps ``start .. stop - 1``.

    Batch ``t`` is slice ``t mod E`` of a permutation drawn for epoch ``t // E`` from ``(seed, epoch)``
    (``E = n // batch_size``, the remainder dropped).
    """

    def __init__(self, n: int, batch_size: int, *, seed: int, start: int, stop: int) -> None:
        if batch_size > n:
            raise ValueError(f"batch_size: {batch_size} is larger than the training split ({n} images)")
        self.n, self.batch_size, self.seed, self.start, self.stop = n, batch_size, seed, start, stop

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    def __iter__(self) -> Iterator[list[int]]:
        per_epoch = self.n // self.batch_size
        epoch, order = -1, None
        for step in range(self.start, self.stop):
            e, i = divmod(step, per_epoch)
            if e != epoch:
                epoch, order = (
                    e,
                    torch.randperm(
                        self.n, generator=torch.Generator().manual_seed(1_000_003 * self.seed + e)
                    ),
                )
            yield order[i * self.batch_size : (i + 1) * self.batch_size].tolist()


def one_cycle(warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """Learning-rate factor of step ``t``: linear from ``1/W`` to 1 over ``W = warmup_steps``, cosine to 0."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


def parameter_groups(
    model: torch.nn.Module,
    *,
    learning_rate: float,
    weight_decay: float,
    replaced: list[str] = (),
    replaced_lr_scale: float = 1.0,
) -> list[dict]:
    """AdamW parameter groups.

    Decay on matrices, none on biases, norms, position embeddings, class token and vectors; the parameters
    of the replaced MLP layers (``<name>.fc1.*`` for each name in ``replaced``) at ``replaced_lr_scale``
    times the learning rate.
    """
    groups: dict[tuple[bool, bool], list] = {}
    prefixes = tuple(f"{name}.fc1." for name in replaced)
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        decay = param.dim() >= 2 and name not in ("pos_embed", "cls_token")
        groups.setdefault((decay, name.startswith(prefixes) if prefixes else False), []).append(param)
    return [
        {
            "params": params,
            "weight_decay": weight_decay if decay else 0.0,
            "lr": learning_rate * (replaced_lr_scale if is_replaced else 1.0),
        }
        for (decay, is_replaced), params in groups.items()
    ]


def batches(dataset: Dataset, batch_size: int, workers: int) -> DataLoader:
    """The evaluation batches of ``dataset`` in order."""
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=False,
        collate_fn=vdata.collate,
        num_workers=workers,
        generator=torch.Generator(),
    )


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, loader: DataLoader, spec: ModelSpec, config: TrainConfig, device: torch.device
) -> dict:
    """``{"accuracy", "loss"}`` over every batch of ``loader``."""
    was_training = model.training
    model.eval()
    correct, loss, count = 0, 0.0, 0
    for images, labels in loader:
        x = vdata.prepare(images.to(device), image_size=model.config.image_size, mean=spec.mean, std=spec.std)
        labels = labels.to(device)
        with ac.autocast(device, config.dtype):
            logits = model(x)
        loss += F.cross_entropy(logits.float(), labels, reduction="sum").item()
        correct += (logits.argmax(-1) == labels).sum().item()
        count += labels.numel()
    model.train(was_training)
    return {"accuracy": correct / count, "loss": loss / count}


@torch.no_grad()
def throughput(
    models: dict[str, torch.nn.Module],
    x: torch.Tensor,
    config: TrainConfig,
    device: torch.device,
    rounds: int = 3,
) -> dict[str, float]:
    """Inference images per second of each model (eval mode), timed in interleaved rounds; the median round.

    Each round runs every model ``throughput_repeats`` times on the same batch ``x`` after two warm-up
    passes, so the models see the same machine load.
    """
    for model in models.values():
        model.eval()
        with ac.autocast(device, config.dtype):
            for _ in range(2):
                model(x)
    speeds: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            with ac.Timer(device) as timer, ac.autocast(device, config.dtype):
                for _ in range(config.throughput_repeats):
                    model(x)
            speeds[name].append(x.shape[0] * config.throughput_repeats / timer.elapsed)
    return {name: statistics.median(values) for name, values in speeds.items()}


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def _rewind_log(path: Path, step: int) -> None:
    """Drop log lines written after ``step`` (by a run killed after its last checkpoint)."""
    kept = [r for r in ac.read_jsonl(path, missing_ok=True) if r["step"] <= step]
    path.unlink(missing_ok=True)
    for record in kept:
        ac.append_jsonl(path, record)


def build(
    config: TrainConfig, num_classes: int, *, pretrained: bool = True
) -> tuple[torch.nn.Module, ModelSpec, dict]:
    """The run's model: the (pretrained) ViT, last k MLPs replaced, attention swapped; and what changed."""
    model, spec = build_model(
        config.model,
        num_classes=num_classes,
        image_size=config.image_size,
        weights=config.weights,
        dropout=config.dropout,
        pretrained=pretrained,
    )
    changed = {
        "replaced": replace_mlps(
            model,
            config.layer,
            last_k=config.last_k,
            features=config.features,
            seed=config.seed,
            options=config.options(),
        )
    }
    if config.attention is not None:
        changed["attention"] = swap_attention(
            model,
            config.attention,
            last_k=config.last_k,
            num_features=config.attention_features,
            seed=config.seed,
        )
    return model, spec, changed


def train(config: TrainConfig, *, on_checkpoint: Callable[[int], None] | None = None) -> dict | None:
    """Run (or resume) one fine-tuning run and append its record to ``config.results``.

    Returns the record, or None when the run's checkpoint says it finished earlier.

    Args:
        config: the run (None fields take the data set's defaults).
        on_checkpoint: called with the step after each checkpoint (an exception there stops the run as a
            kill would, with the checkpoint on disk).

    Raises:
        ValueError: bad settings, data, weights or checkpoint (each names what is wrong).
        FileNotFoundError: data or weights not found.
    """
    config = config.resolved()
    device = ac.resolve_device(config.device)
    name = run_name(config)
    run_dir = Path(config.runs) / name

    image_size = config.image_size or MODELS.get(config.model).config.image_size
    splits = vdata.load(config.data, config.data_path, image_size=image_size)
    fit_set = splits.split("train" if config.tune else "trainval")
    eval_split = "val" if config.tune else "test"
    eval_loader = batches(splits.split(eval_split), config.batch_size, config.workers)

    ac.seed_everything(config.seed)
    model, spec, changed = build(config, splits.num_classes)
    model.to(device)
    steps_per_epoch = len(fit_set) // config.batch_size
    total = config.max_steps or config.epochs * max(1, steps_per_epoch)
    eval_every = config.eval_every or max(1, steps_per_epoch)
    optimizer = torch.optim.AdamW(
        parameter_groups(
            model,
            learning_rate=config.learning_rate,
            weight_decay=config.weight_decay,
            replaced=changed["replaced"],
            replaced_lr_scale=config.replaced_lr_scale,
        ),
        lr=config.learning_rate,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, one_cycle(max(1, round(config.warmup * total)), total)
    )

    state = {"step": 0, "train_time": 0.0, "finished": False}
    checkpoint = ac.load_checkpoint(run_dir / CHECKPOINT) if config.resume else None
    if checkpoint is not None:
        if checkpoint["run"] != name:
            raise ValueError(f"{run_dir / CHECKPOINT}: holds run {checkpoint['run']!r}, expected {name!r}")
        if checkpoint["state"]["finished"]:
            print(f"{name}: finished earlier (see {config.results}); nothing to do")
            return None
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        state.update(checkpoint["state"])
        ac.set_rng_state(checkpoint["rng"])
        print(f"{name}: resuming at step {state['step']} from {run_dir / CHECKPOINT}")
        _rewind_log(run_dir / LOG, state["step"])
    else:
        (run_dir / LOG).unlink(missing_ok=True)

    def save(finished: bool = False) -> None:
        ac.save_checkpoint(
            run_dir / CHECKPOINT,
            {
                "run": name,
                "config": ac.config_dict(config),
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "state": {**state, "finished": finished},
                "rng": ac.rng_state(),
            },
        )

    loader = DataLoader(
        fit_set,
        batch_sampler=StepBatches(
            len(fit_set), config.batch_size, seed=config.seed, start=state["step"], stop=total
        ),
        collate_fn=vdata.collate,
        num_workers=config.workers,
        pin_memory=device.type == "cuda",
        generator=torch.Generator().manual_seed(config.seed),
    )
    augment = torch.Generator()
    timer = ac.Timer(device, elapsed=state["train_time"])
    bar = ac.progress(total=total, initial=state["step"], desc=name)
    loss_sum, losses = torch.zeros((), device=device), 0
    model.train()
    timer.start()
    for images, labels in loader:
        augment.manual_seed(1_000_003 * config.seed + state["step"])
        x = vdata.prepare(
            images.to(device, non_blocking=True),
            image_size=model.config.image_size,
            mean=spec.mean,
            std=spec.std,
            augment=config.augment,
            generator=augment,
        )
        labels = labels.to(device, non_blocking=True)
        with ac.autocast(device, config.dtype):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        scheduler.step()
        state["step"] += 1
        step = state["step"]
        loss_sum += loss.detach()
        losses += 1
        bar.update(1)
        if step % config.log_every == 0 or step == total:
            mean = (loss_sum / losses).item()
            loss_sum.zero_()
            losses = 0
            bar.set_postfix(loss=f"{mean:.4f}")
            ac.append_jsonl(
                run_dir / LOG, {"step": step, "train_loss": mean, "lr": scheduler.get_last_lr()[0]}
            )
        if step % eval_every == 0 or step == total:
            state["train_time"] = timer.stop()
            result = evaluate(model, eval_loader, spec, config, device)
            ac.append_jsonl(
                run_dir / LOG,
                {
                    "step": step,
                    f"{eval_split}_accuracy": result["accuracy"],
                    f"{eval_split}_loss": result["loss"],
                },
            )
            bar.set_postfix(acc=f"{result['accuracy']:.3f}")
            save()
            if on_checkpoint is not None:
                on_checkpoint(step)
            timer.start()
    state["train_time"] = timer.stop()
    bar.close()

    result = evaluate(model, eval_loader, spec, config, device)
    dense, _, _ = build(
        dataclasses.replace(config, layer="dense", attention=None), splits.num_classes, pretrained=False
    )
    dense.to(device)
    fast = compressed(model)
    images, _ = next(iter(batches(splits.split(eval_split), config.throughput_batch, 0)))
    x = vdata.prepare(images.to(device), image_size=model.config.image_size, mean=spec.mean, std=spec.std)
    if x.shape[0] < config.throughput_batch:
        x = x.repeat(math.ceil(config.throughput_batch / x.shape[0]), 1, 1, 1)[: config.throughput_batch]
    speed = throughput({"dense": dense, "model": model, "compressed": fast}, x, config, device)
    record = {
        "run": name,
        "data": config.data,
        "model": config.model,
        "layer": config.layer,
        "last_k": config.last_k if config.layer != "dense" or config.attention else 0,
        "features": config.features,
        "attention": config.attention,
        "seed": config.seed,
        "eval_split": eval_split,
        "accuracy": result["accuracy"],
        "eval_loss": result["loss"],
        "steps": state["step"],
        "train_time_s": state["train_time"],
        "parameters": count_parameters(model),
        "parameters_compressed": count_parameters(fast),
        "parameters_dense": count_parameters(dense),
        "throughput": speed["model"],
        "throughput_compressed": speed["compressed"],
        "throughput_dense": speed["dense"],
        "throughput_batch": x.shape[0],
        "replaced": changed["replaced"],
        "attention_copied": len(changed.get("attention", {}).get("copied", [])),
        "device": _device_name(device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "log": str(run_dir / LOG),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": ac.config_dict(config),
    }
    ac.append_jsonl(config.results, record)
    save(finished=True)
    print(
        f"{name}: {eval_split} accuracy {result['accuracy']:.4f}, {record['parameters']:,} parameters "
        f"({record['parameters_dense']:,} dense), {speed['model']:.0f} img/s ({speed['dense']:.0f} dense), "
        f"{state['train_time']:.1f} s"
    )
    return record
