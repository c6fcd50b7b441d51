"""``vit-finetune train``: one fine-tuning run, its checkpoints, and its record (accuracy, size, throughput).

Top-down (`train`): read the data, build the (pretrained) ViT and replace the MLPs of the last k
blocks (and their attention with ``--attention``), calibrated on a batch of training images
(`build`); then AdamW steps under linear warm-up and cosine decay with gradient-norm clipping, run by
``app_common.harness.Trainer``; every ``eval_every`` steps the evaluation split's accuracy goes to the run's
log and a checkpoint is saved. At the end the model is evaluated once more and timed for inference against the
dense model built in the same process and against its compressed form, ``fc2`` folded into each
linearized ``fc1`` (`final_record`), and one JSON line is appended to the results file.

The batch of step ``t`` and its augmentation depend only on ``(seed, t)``, and the harness's checkpoint
holds the model, optimizer, counters and random states, so a killed run resumes (the default) to the
weights, log and record of an unbroken one; resuming under other identity settings is refused.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import ralimp
from app_common.batches import stream_seed
from app_common.device import autocast
from app_common.distributed import evaluation_sums
from app_common.harness import TrainData, Trainer
from app_common.measure import count_parameters, interleaved_medians
from app_common.run import Run
from app_common.schedules import param_groups, schedule
from app_common.seeding import CALIBRATION_SEED
from vit_finetune import data as vdata
from vit_finetune.config import TrainConfig, run_label
from vit_finetune.surgery import LAYER_OPTIONS, compressed, replace_mlps, swap_attention
from vit_finetune.weights import MODELS, ModelSpec, build_model

#: Tokens of the batch that calibrates the replaced MLPs: as many as ``ralimp.replace_mlp`` keeps per layer
#: (its ``max_calibration_rows``, read from ralimp: the one source of that number).
CALIBRATION_TOKENS = ralimp.MAX_CALIBRATION_ROWS


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

    def sums(batch: tuple[torch.Tensor, torch.Tensor], forward: Callable[..., torch.Tensor]) -> torch.Tensor:
        images, labels = batch
        x = vdata.prepare(images.to(device), image_size=model.config.image_size, mean=spec.mean, std=spec.std)
        labels = labels.to(device)
        logits = forward(x)
        loss = F.cross_entropy(logits.float(), labels, reduction="sum")
        correct = (logits.argmax(-1) == labels).sum()
        count = torch.tensor(labels.numel(), device=device)
        return torch.stack([loss.double(), correct.double(), count.double()])

    loss, correct, count = evaluation_sums(
        model, loader, sums, size=3, device=device, dtype=config.dtype
    ).tolist()
    return {"accuracy": correct / count, "loss": loss / count}


def throughput(
    models: dict[str, torch.nn.Module], x: torch.Tensor, config: TrainConfig, device: torch.device
) -> dict[str, float]:
    """Inference images per second of each model (eval mode): the median of 3 interleaved rounds.

    Each round runs every model ``throughput_repeats`` times on the same batch ``x``, one model after
    another (``app_common.measure.interleaved_medians``, after one uncounted round), so the models see the
    same machine load.
    """

    def forward_passes(model: torch.nn.Module) -> Callable[[], None]:
        @torch.no_grad()
        def run() -> None:
            with autocast(device, config.dtype):
                for _ in range(config.throughput_repeats):
                    model(x)

        return run

    for model in models.values():
        model.eval()
    seconds = interleaved_medians(
        {name: forward_passes(model) for name, model in models.items()}, repeats=3, warmup=1, device=device
    )
    return {name: x.shape[0] * config.throughput_repeats / s for name, s in seconds.items()}


def calibration_images(
    fit_set: Dataset, config: TrainConfig, spec: ModelSpec, image_size: int, device: torch.device
) -> torch.Tensor:
    """The images that calibrate the replaced layers: about `CALIBRATION_TOKENS` tokens' worth.

    The first ``ceil(CALIBRATION_TOKENS / tokens per image)`` images of a permutation of the training
    split seeded with ``app_common.seeding.CALIBRATION_SEED``, prepared as in evaluation (no augmentation):
    ``(B, 3, S, S)`` on ``device``.
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
            **config.ralimp_options(config.layer),
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

    Returns the record, or None when the run finished earlier. The run's folder is
    ``<out>/runs/<run_name>/`` (``app_common.harness.Trainer``: checkpoint, log, record).

    Args:
        config: the run (None fields take the data set's defaults).
        on_checkpoint: called with the step after each checkpoint (``app_common.testing.kill_at`` raises
            there to stop the run as a kill would, with the checkpoint on disk).

    Raises:
        ValueError: bad settings, data, weights or checkpoint (each names what is wrong).
        FileNotFoundError: data or weights not found.
    """
    config = config.resolved()
    image_size = config.image_size or MODELS.get(config.model).config.image_size
    splits = vdata.load(config.data, config.data_path, image_size=image_size)
    fit_set = splits.split("train" if config.tune else "trainval")
    eval_split = "val" if config.tune else "test"
    steps_per_epoch = max(1, len(fit_set) // config.batch_size)
    total = config.steps or config.epochs * steps_per_epoch
    run = Run.from_config(config, label=run_label(config), on_save=on_checkpoint, distributed=False)
    name = run.name
    if run.finished() is not None:
        print(f"{name}: finished earlier (see {config.results}); nothing to do")
        return None
    device = run.device
    model, spec, changed = build(
        config,
        splits.num_classes,
        calibration=lambda spec, size: calibration_images(fit_set, config, spec, size, device),
        device=device,
    )
    groups = param_groups(
        model,
        config.weight_decay,
        lr=config.lr,
        lr_scales=[(f"{layer}.fc1.", config.replaced_lr_scale) for layer in changed["replaced"]],
    )
    warmup = config.warmup_steps if config.warmup_steps is not None else max(1, round(0.1 * total))
    trainer = Trainer.from_config(
        config,
        run,
        model,
        torch.optim.AdamW(groups, lr=config.lr),
        steps=total,
        eval_every=config.eval_every or steps_per_epoch,
        schedule=schedule("cosine", warmup, total),
    )
    augment = torch.Generator()

    def loss(step: int, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        images, labels = batch
        augment.manual_seed(stream_seed(config.seed, step))
        x = vdata.prepare(
            images.to(device, non_blocking=True),
            image_size=model.config.image_size,
            mean=spec.mean,
            std=spec.std,
            augment=config.augment,
            generator=augment,
        )
        return F.cross_entropy(trainer.forward(x).float(), labels.to(device, non_blocking=True))

    eval_loader = batches(splits.split(eval_split), config.batch_size, config.workers)

    def validate(step: int) -> dict[str, float]:
        result = evaluate(model, eval_loader, spec, config, device)
        return {f"{eval_split}_accuracy": result["accuracy"], f"{eval_split}_loss": result["loss"]}

    trainer.fit(
        loss,
        data=TrainData(fit_set, config.batch_size, vdata.collate, config.workers),
        evaluate=validate,
    )
    metrics, details = final_record(config, model, spec, changed, splits, eval_split, device)
    details.update(log=str(run.log_path), fits=ralimp.fit_summary(model))
    record = trainer.finish(trainer.record(config, metrics=metrics, details=details), results=config.results)
    print(
        f"{name}: {eval_split} accuracy {metrics['accuracy']:.4f}, {record['trainable_parameters']:,} "
        f"parameters ({details['parameters_dense']:,} dense), {details['throughput']:.0f} img/s "
        f"({details['throughput_dense']:.0f} dense), {trainer.train_seconds:.1f} s"
    )
    return record


def final_record(
    config: TrainConfig,
    model: torch.nn.Module,
    spec: ModelSpec,
    changed: dict,
    splits: vdata.Splits,
    eval_split: str,
    device: torch.device,
) -> tuple[dict, dict]:
    """The run's ``(metrics, details)``: accuracy on the evaluation split, parameters, inference throughput.

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
    metrics = {"accuracy": result["accuracy"], "eval_loss": result["loss"]}
    details = {
        "data": config.data,
        "model": config.model,
        "layer": config.layer,
        "last_k": config.last_k if config.layer != "dense" or config.attention != "softmax" else 0,
        "features": config.features,
        "init": changed["init"],
        "layer_options": LAYER_OPTIONS.get(config.layer, {}),
        "attention": config.attention,
        "eval_split": eval_split,
        "parameters_compressed": count_parameters(fast),
        "parameters_dense": count_parameters(dense),
        "throughput": speed["model"],
        "throughput_compressed": speed["compressed"],
        "throughput_dense": speed["dense"],
        "throughput_batch": x.shape[0],
        "replaced": changed["replaced"],
        "attention_copied": len(changed.get("attention", {}).get("copied", [])),
        "threads": torch.get_num_threads(),
    }
    return metrics, details
