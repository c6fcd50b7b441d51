"""``vit-finetune train``: one fine-tuning run, its checkpoints, and its record (accuracy, size, throughput).

Top-down (`train`): read the data, build the (pretrained) ViT and replace the MLPs of the last k
blocks (and their attention with ``--attention``), calibrated on a batch of training images
(`build`); then AdamW steps under the one-cycle schedule with gradient-norm clipping
(`fit`); every ``eval_every`` steps the evaluation split's accuracy goes to the run's log and a
checkpoint is saved. At the end the model is evaluated once more and timed for inference against the
dense model built in the same process and against its compressed form, ``fc2`` folded into each
linearized ``fc1`` (`final_record`), and one JSON line is appended to the results file.

The batch of step ``t`` depends only on ``(seed, t)`` (``app_common.StepBatches``), and a checkpoint holds
the model, optimizer, schedule, counters and random states, so a killed run resumes (the default) to the
same weights; resuming under other identity settings is refused (``app_common.Checkpointer``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import app_common as ac
import ralimp
from vit_finetune import data as vdata
from vit_finetune.config import TrainConfig, run_name
from vit_finetune.surgery import LAYER_OPTIONS, compressed, replace_mlps, swap_attention
from vit_finetune.weights import MODELS, ModelSpec, build_model

CHECKPOINT = "checkpoint.pt"
LOG = "log.jsonl"
CALIBRATION_TOKENS = 4096  # tokens of the calibration batch (ralimp.replace_mlp keeps at most 4096 per layer)
CALIBRATION_SEED = 31_415_926  # its images: the first ones of a permutation of the training split


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


def throughput(
    models: dict[str, torch.nn.Module], x: torch.Tensor, config: TrainConfig, device: torch.device
) -> dict[str, float]:
    """Inference images per second of each model (eval mode): the median of 3 interleaved rounds.

    Each round runs every model ``throughput_repeats`` times on the same batch ``x``, one model after
    another (``app_common.interleaved_medians``, after one uncounted round), so the models see the same
    machine load.
    """

    def forward_passes(model: torch.nn.Module) -> Callable[[], None]:
        @torch.no_grad()
        def run() -> None:
            with ac.autocast(device, config.dtype):
                for _ in range(config.throughput_repeats):
                    model(x)

        return run

    for model in models.values():
        model.eval()
    seconds = ac.interleaved_medians(
        {name: forward_passes(model) for name, model in models.items()}, repeats=3, warmup=1, device=device
    )
    return {name: x.shape[0] * config.throughput_repeats / s for name, s in seconds.items()}


def calibration_images(
    fit_set: Dataset, config: TrainConfig, spec: ModelSpec, image_size: int, device: torch.device
) -> torch.Tensor:
    """The images that calibrate the replaced layers: about `CALIBRATION_TOKENS` tokens' worth.

    The first ``ceil(4096 / tokens per image)`` images of a fixed permutation of the training split,
    prepared as in evaluation (no augmentation): ``(B, 3, S, S)`` on ``device``.
    """
    patch = MODELS.get(config.model).config.patch_size
    tokens = (image_size // patch) ** 2 + 1
    count = min(len(fit_set), math.ceil(CALIBRATION_TOKENS / tokens))
    order = torch.randperm(len(fit_set), generator=torch.Generator().manual_seed(CALIBRATION_SEED))
    images, _ = vdata.collate([fit_set[int(i)] for i in order[:count]])
    return vdata.prepare(images.to(device), image_size=image_size, mean=spec.mean, std=spec.std)


def build(
    config: TrainConfig,
    num_classes: int,
    *,
    pretrained: bool = True,
    calibration: Callable[[ModelSpec, int], torch.Tensor] | None = None,
    device: torch.device | str = "cpu",
) -> tuple[torch.nn.Module, ModelSpec, dict]:
    """The run's model on ``device``: the (pretrained) ViT, last k MLPs replaced, attention swapped.

    Args:
        config: the run (resolved).
        num_classes: classes of the head.
        pretrained: False builds the shape with random weights (the dense model timed for comparison).
        calibration: ``(spec, image_size) -> images`` of the batch the replaced layers are calibrated on
            (None: no calibration; then ``init`` must be ``psi``).
        device: where the model is built and calibrated.

    Returns:
        The model, its spec and what changed: ``{"replaced": [...], "init": start, "attention": {...}}``
        (``init="auto"`` resolved: ``lstsq`` where pretrained weights were loaded, else ``psi``).
    """
    model, spec = build_model(
        config.model,
        num_classes=num_classes,
        image_size=config.image_size,
        weights=config.weights,
        dropout=config.dropout,
        pretrained=pretrained,
    )
    model.to(device)
    inputs = None
    if calibration is not None and config.layer != "dense":
        inputs = calibration(spec, model.config.image_size)
    start = config.init
    if start == "auto":
        has_weights = pretrained and (config.weights is not None or spec.hub_repo is not None)
        start = "lstsq" if has_weights else "psi"
    if inputs is None:
        start = "psi"
    changed = {
        "replaced": replace_mlps(
            model,
            config.layer,
            last_k=config.last_k,
            features=config.features,
            seed=config.seed,
            inputs=inputs,
            init=start,
            weight_matrix=config.weight_matrix,
        ),
        "init": start,
    }
    if config.attention != "softmax":
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
        on_checkpoint: called with the step after each checkpoint (``app_common.testing.kill_at`` raises
            there to stop the run as a kill would, with the checkpoint on disk).

    Raises:
        ValueError: bad settings, data, weights or checkpoint (each names what is wrong).
        FileNotFoundError: data or weights not found.
    """
    config = config.resolved()
    device = ac.resolve_device(config.device)
    if config.threads:
        torch.set_num_threads(config.threads)
    name = run_name(config)
    run_dir = Path(config.out) / name

    image_size = config.image_size or MODELS.get(config.model).config.image_size
    splits = vdata.load(config.data, config.data_path, image_size=image_size)
    fit_set = splits.split("train" if config.tune else "trainval")
    eval_split = "val" if config.tune else "test"

    ac.seed_everything(config.seed)
    model, spec, changed = build(
        config,
        splits.num_classes,
        calibration=lambda spec, size: calibration_images(fit_set, config, spec, size, device),
        device=device,
    )
    steps_per_epoch = max(1, len(fit_set) // config.batch_size)
    total = config.steps or config.epochs * steps_per_epoch
    optimizer, scheduler = optimizer_and_schedule(model, config, changed["replaced"], total)

    checkpointer = ac.Checkpointer(
        run_dir / CHECKPOINT, ac.run_identity(config), resume=config.resume, on_save=on_checkpoint
    )
    progress = restore(checkpointer, log=run_dir / LOG, model=model, optimizer=optimizer, scheduler=scheduler)
    if progress is None:
        print(f"{name}: finished earlier (see {config.results}); nothing to do")
        return None

    def save(finished: bool = False) -> None:
        parts = ac.state_dicts(model=model, optimizer=optimizer, scheduler=scheduler)
        counters = {"train_time": progress["train_time"], "finished": finished}
        checkpointer.save(progress["step"], {**parts, "progress": counters, "rng": ac.rng_state()})

    eval_loader = batches(splits.split(eval_split), config.batch_size, config.workers)
    fit(
        config,
        model,
        spec,
        optimizer,
        scheduler,
        fit_set,
        eval_loader,
        eval_split=eval_split,
        total=total,
        eval_every=config.eval_every or steps_per_epoch,
        progress=progress,
        save=save,
        log=run_dir / LOG,
        device=device,
    )
    record = final_record(config, model, spec, changed, splits, eval_split, progress, device)
    record.update(run=name, log=str(run_dir / LOG), fits=ralimp.fit_summary(model))
    ac.append_jsonl(config.results, record)
    save(finished=True)
    print(
        f"{name}: {eval_split} accuracy {record['accuracy']:.4f}, {record['parameters']:,} parameters "
        f"({record['parameters_dense']:,} dense), {record['throughput']:.0f} img/s "
        f"({record['throughput_dense']:.0f} dense), {progress['train_time']:.1f} s"
    )
    return record


def optimizer_and_schedule(
    model: torch.nn.Module, config: TrainConfig, replaced: list[str], total: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `parameter_groups` and the `one_cycle` schedule of ``total`` steps."""
    optimizer = torch.optim.AdamW(
        parameter_groups(
            model,
            learning_rate=config.lr,
            weight_decay=config.weight_decay,
            replaced=replaced,
            replaced_lr_scale=config.replaced_lr_scale,
        ),
        lr=config.lr,
    )
    warmup = max(1, round(config.warmup * total))
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, one_cycle(warmup, total))


def restore(checkpointer: ac.Checkpointer, *, log: Path, **parts) -> dict | None:
    """The counters (``step``, ``train_time``) of the checkpoint, its ``parts`` and random state loaded.

    Fresh counters (and no log) when there is no checkpoint to resume; None when it says the run finished.
    The log loses the lines written after the checkpoint by the run that was killed.
    """
    state = checkpointer.load()
    if state is None:
        log.unlink(missing_ok=True)
        return {"step": 0, "train_time": 0.0}
    if state["progress"]["finished"]:
        return None
    ac.load_state_dicts(state, **parts)
    ac.set_rng_state(state["rng"])
    print(f"{log.parent.name}: resuming at step {state['step']} from {checkpointer.path}")
    ac.rewind_log(log, state["step"])
    return {"step": state["step"], "train_time": state["progress"]["train_time"]}


def fit(
    config: TrainConfig,
    model: torch.nn.Module,
    spec: ModelSpec,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    fit_set: Dataset,
    eval_loader: DataLoader,
    *,
    eval_split: str,
    total: int,
    eval_every: int,
    progress: dict,
    save: Callable[[], None],
    log: Path,
    device: torch.device,
) -> None:
    """The training loop, from step ``progress["step"]`` to ``total``: one AdamW step per batch.

    Logs the mean training loss every ``log_every`` steps; every ``eval_every`` steps and at the end
    evaluates, logs the accuracy and checkpoints (``save``). ``progress`` (``step``, ``train_time``) is
    updated in place.
    """
    loader = DataLoader(
        fit_set,
        batch_sampler=ac.StepBatches(
            len(fit_set), config.batch_size, seed=config.seed, start_step=progress["step"]
        ),
        collate_fn=vdata.collate,
        num_workers=config.workers,
        pin_memory=device.type == "cuda",
        generator=torch.Generator().manual_seed(config.seed),
    )
    augment = torch.Generator()
    timer = ac.Timer(device, elapsed=progress["train_time"])
    bar = ac.progress(total=total, initial=progress["step"], desc=log.parent.name)
    loss_sum, losses = torch.zeros((), device=device), 0
    model.train()
    timer.start()
    for images, labels in loader:
        if progress["step"] >= total:
            break
        augment.manual_seed(ac.stream_seed(config.seed, progress["step"]))
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
        progress["step"] += 1
        step = progress["step"]
        loss_sum += loss.detach()
        losses += 1
        bar.update(1)
        if step % config.log_every == 0 or step == total:
            mean = (loss_sum / losses).item()
            loss_sum.zero_()
            losses = 0
            bar.set_postfix(loss=f"{mean:.4f}")
            ac.append_jsonl(log, {"step": step, "train_loss": mean, "lr": scheduler.get_last_lr()[0]})
        if step % eval_every == 0 or step == total:
            progress["train_time"] = timer.stop()
            result = evaluate(model, eval_loader, spec, config, device)
            ac.append_jsonl(
                log,
                {
                    "step": step,
                    f"{eval_split}_accuracy": result["accuracy"],
                    f"{eval_split}_loss": result["loss"],
                },
            )
            bar.set_postfix(acc=f"{result['accuracy']:.3f}")
            save()
            timer.start()
    progress["train_time"] = timer.stop()
    bar.close()


def final_record(
    config: TrainConfig,
    model: torch.nn.Module,
    spec: ModelSpec,
    changed: dict,
    splits: vdata.Splits,
    eval_split: str,
    progress: dict,
    device: torch.device,
) -> dict:
    """The run's result: accuracy on the evaluation split, parameters and inference throughput.

    Parameters and throughput of the run's model, of its compressed form and of the dense model (same
    shape, random weights, built here), all timed on the same batch of evaluation images.
    """
    result = evaluate(
        model, batches(splits.split(eval_split), config.batch_size, config.workers), spec, config, device
    )
    dense, _, _ = build(
        dataclasses.replace(config, layer="dense", attention="softmax"),
        splits.num_classes,
        pretrained=False,
        device=device,
    )
    fast = compressed(model)
    images, _ = next(iter(batches(splits.split(eval_split), config.throughput_batch, 0)))
    x = vdata.prepare(images.to(device), image_size=model.config.image_size, mean=spec.mean, std=spec.std)
    if x.shape[0] < config.throughput_batch:
        x = x.repeat(math.ceil(config.throughput_batch / x.shape[0]), 1, 1, 1)[: config.throughput_batch]
    speed = throughput({"dense": dense, "model": model, "compressed": fast}, x, config, device)
    return {
        "data": config.data,
        "model": config.model,
        "layer": config.layer,
        "last_k": config.last_k if config.layer != "dense" or config.attention != "softmax" else 0,
        "features": config.features,
        "init": changed["init"],
        "layer_options": LAYER_OPTIONS.get(config.layer, {}),
        "attention": config.attention,
        "seed": config.seed,
        "eval_split": eval_split,
        "accuracy": result["accuracy"],
        "eval_loss": result["loss"],
        "steps": progress["step"],
        "train_time_s": progress["train_time"],
        "parameters": ac.count_parameters(model),
        "parameters_compressed": ac.count_parameters(fast),
        "parameters_dense": ac.count_parameters(dense),
        "throughput": speed["model"],
        "throughput_compressed": speed["compressed"],
        "throughput_dense": speed["dense"],
        "throughput_batch": x.shape[0],
        "replaced": changed["replaced"],
        "attention_copied": len(changed.get("attention", {}).get("copied", [])),
        "device": ac.device_name(device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": ac.config_dict(config),
    }
