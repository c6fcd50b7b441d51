"""``gpt-uptrain train``: nanoGPT's training loop with the paper's protocol, checkpoints and exact resume.

Top-down (`train`): check that the data and the device can hold the run, build the model (from
scratch, or from a local HF GPT-2, the replacements applied after the pretrained weights are in and
calibrated on a training batch), AdamW, then (``--transfer-steps``) attention transfer, then iterate.
One optimizer step (`train_step`) is
``gradient_accumulation_steps`` micro-batches (split over the processes under ``torchrun``) and one clipped
AdamW step at the learning rate of `learning_rate` (linear warm-up, cosine decay to ``min_lr``).
Every ``eval_every`` steps and at the end: validation loss over the same ``eval_batches`` batches, a log
line and a checkpoint. The final validation perplexity ``exp(mean loss)`` at the fixed budget ``steps``
goes to the results file.

Reproducible by construction: micro-batch ``j`` of step ``i`` is drawn from ``(seed, i, j)``, process ``r``
of ``W`` takes micro-steps ``r, r + W, ...`` and DDP averages its gradients, so any number of processes
computes the one-process update; a checkpoint holds the model, optimizer, counters and every process's
random state, so ``--resume`` continues a killed run exactly.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import ralimp
import rf_attention
from app_common import fields
from app_common.checkpoint import load_checkpoint
from app_common.distributed import Distributed, evaluation_sums
from app_common.harness import Trainer
from app_common.run import Run
from app_common.schedules import Schedule, schedule
from app_common.seeding import CALIBRATION_SEED
from gpt_uptrain import hf
from gpt_uptrain.config import TrainConfig
from gpt_uptrain.data import TokenData
from gpt_uptrain.model import GPT, REPLACEMENT_FIELDS, GPTConfig

EVAL_SEED = 20_240_607  # validation batches are the same for every run and every evaluation
#: Tokens of the batch that calibrates the replaced MLPs: as many as ``ralimp.replace_mlp`` keeps per layer
#: (its ``max_calibration_rows``, read from ralimp: the one source of that number).
CALIBRATION_TOKENS = ralimp.MAX_CALIBRATION_ROWS
#: Attention-transfer batch ``i`` is drawn from ``(seed, TRANSFER_SEED, i)``: apart from the training batches.
TRANSFER_SEED = 20_261_203


class TransferResult:
    """The attention transfer's per-layer MSEs, carried by checkpoints (a resumed run does not redo it)."""

    def __init__(self) -> None:
        self.report: dict[str, Any] = {}

    def state_dict(self) -> dict[str, Any]:
        """The report, for a checkpoint."""
        return dict(self.report)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the report of a checkpoint."""
        self.report = dict(state)


def transfer_attention(
    model: GPT, data: TokenData, config: TrainConfig, device: torch.device
) -> dict[str, Any]:
    """Stage 1 of a linearization: ``rf_attention.transfer.attention_transfer`` on ``transfer_steps`` batches.

    Only the blocks' RF feature maps train (AdamW at ``transfer_lr``), each attention matching softmax on its
    own ``q, k, v``; batch ``i`` is drawn from ``(seed, TRANSFER_SEED, i)``. Returns the report as plain
    values (steps, per-layer MSE before and after on the first batch).
    """
    block_size = model.config.block_size
    batches = (
        data.batch(
            "train", config.batch_size, block_size, seed=(config.seed, TRANSFER_SEED, i), device=device
        )[0]
        for i in range(config.transfer_steps)
    )
    report = rf_attention.transfer.attention_transfer(
        model, batches, steps=config.transfer_steps, lr=config.transfer_lr
    )
    return {"steps": report.steps, "mse_before": list(report.mse_before), "mse_after": list(report.mse_after)}


def lr_schedule(config: TrainConfig) -> Schedule:
    """NanoGPT's schedule as a factor of ``lr``: linear warm-up, cosine to ``min_lr`` at ``lr_decay_steps``.

    ``lr_decay_steps`` is ``steps`` when None; the rate stays at ``min_lr`` after it.
    """
    decay_steps = config.lr_decay_steps or config.steps
    return schedule("cosine", config.warmup_steps, decay_steps, final=config.min_lr / config.lr)


def learning_rate(step: int, config: TrainConfig) -> float:
    """The learning rate of the 0-based ``step`` (`lr_schedule` times ``lr``)."""
    return config.lr * lr_schedule(config)(step)


def run_label(config: TrainConfig) -> str:
    """``ralimp-k1-softmax-s0``: MLP kind, replaced blocks, attention and seed, the head of the run's name."""
    m = config.model
    return f"{m.layer}-k{m.last_k or 'half'}-{m.attention}-s{config.seed}"


def run_name(config: TrainConfig) -> str:
    """``ralimp-k1-softmax-s0-1a2b3c4d``: `run_label` and a digest of the run's identity.

    The apps' one scheme ([`app_common.fields.run_name`][app_common.fields.run_name]).
    """
    return fields.run_name(run_label(config), fields.run_identity(config))


def run_model_config(config: TrainConfig, vocab_size: int) -> GPTConfig:
    """The architecture the run will build, known before any weight is allocated.

    From scratch: ``config.model`` with the data's vocabulary; from an HF folder: the shape of its
    ``config.json`` (context cropped to ``model.block_size``) with the run's other model fields.
    """
    if config.weights == "scratch":
        return config.model_config(vocab_size)
    shape = hf.gpt2_config_fields(hf.read_config(config.weights))
    shape["block_size"] = min(shape["block_size"], config.model.block_size)
    return dataclasses.replace(config.model_config(vocab_size), **shape)


def training_memory(model: GPTConfig, batch_size: int, dtype: str) -> dict[str, int]:
    """Estimated bytes that training ``model`` on micro-batches of ``batch_size`` sequences holds at once.

    - ``parameters``: 16 bytes per parameter (float32 weights and gradients, AdamW's two moments), counted
      on the dense model (`GPTConfig.num_parameters`);
    - ``activations``: what the backward pass keeps, about ``34 n_embd`` bytes per token and block at 16
      bits (Korthikanti et al. 2022, Eq. 2 without the attention scores, which the fused attention kernels
      do not store) and twice that in float32;
    - ``logits``: ``batch_size x block_size x vocab_size`` float32 values three times (the logits, their
      float copy for the loss and its gradient).

    A lower estimate: allocator slack, the replacement layers' features and an unfused attention add to it.
    """
    tokens = batch_size * model.block_size
    per_value = 34 if dtype == "bfloat16" else 68
    return {
        "parameters": 16 * model.num_parameters(),
        "activations": per_value * model.n_layer * tokens * model.n_embd,
        "logits": 3 * 4 * tokens * model.vocab_size,
    }


def available_memory(device: torch.device) -> int:
    """Bytes one process may use: free CUDA memory, or the available RAM shared by this node's ranks."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        free = info.get("MemAvailable", info["MemFree"])
    except (OSError, KeyError, ValueError):
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return free // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def check_fits(model: GPTConfig, config: TrainConfig, device: torch.device) -> None:
    """Refuse a run whose `training_memory` exceeds `available_memory`, before building it.

    Raises:
        MemoryError: naming the estimate's parts, what is available and the settings that lower it.
    """
    need = training_memory(model, config.batch_size, config.dtype)
    have = available_memory(device)
    if sum(need.values()) > have:
        parts = ", ".join(f"{name} {value / 1e9:.1f}" for name, value in need.items())
        raise MemoryError(
            f"memory: training this {model.num_parameters() / 1e6:.0f}M-parameter model "
            f"(n_layer={model.n_layer}, n_embd={model.n_embd}) with batch_size={config.batch_size} x "
            f"block_size={model.block_size} needs about {sum(need.values()) / 1e9:.1f} GB ({parts}) but "
            f"{device} has {have / 1e9:.1f} GB available; lower --batch-size, --block-size, --n-layer or "
            "--n-embd (or --no-memory-check to try anyway)"
        )


def build_model(config: TrainConfig, data: TokenData, device: torch.device) -> GPT:
    """The run's model on ``device``: from scratch, or the HF GPT-2 of ``weights`` with the run's changes.

    The dense model is built (or loaded) on the CPU, so that the same seed gives the same weights on
    every device, and moved to ``device``; then its MLPs are replaced there, calibrated on a fixed training
    batch of about `CALIBRATION_TOKENS` tokens (seeded with ``app_common.seeding.CALIBRATION_SEED``) and
    started from ``config.start``.

    Raises:
        ValueError: the data's vocabulary does not fit the pretrained model's.
    """
    dense = dataclasses.replace(config.model_config(data.vocab_size), layer="dense")
    if config.weights == "scratch":
        model = GPT(dense)
    else:
        pretrained = hf.gpt2_config_fields(hf.read_config(config.weights))
        if data.vocab_size > pretrained["vocab_size"]:
            raise ValueError(
                f"data: its {data.vocab_size}-token vocabulary does not fit the pretrained model's "
                f"{pretrained['vocab_size']} (prepare it with --tokenizer gpt2)"
            )
        kept = (
            "dropout",
            "attention",
            "attention_features",
            "attention_window",
            "learnable_attention",
            "attention_input_map",
            "seed",
        )
        model = GPT.from_pretrained(
            config.weights, block_size=dense.block_size, **{name: getattr(dense, name) for name in kept}
        )
    model.to(device)
    calibration = None
    if config.model.layer != "dense":
        block_size = model.config.block_size
        calibration, _ = data.batch(
            "train",
            -(-CALIBRATION_TOKENS // block_size),
            block_size,
            seed=(config.seed, CALIBRATION_SEED),
            device=device,
        )
    replacement = {name: getattr(config.model, name) for name in REPLACEMENT_FIELDS}
    model.linearize_mlps(calibration, init=config.start, **replacement)
    return model


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: TokenData, config: TrainConfig, dist: Distributed) -> float:
    """Mean validation loss over batches ``0 .. eval_batches - 1`` (the same in every run), over the ranks."""
    block_size = model.config.block_size

    def loss_and_count(k: int, forward: Callable[..., tuple[Any, torch.Tensor]]) -> torch.Tensor:
        x, y = data.batch("val", config.batch_size, block_size, seed=(EVAL_SEED, k), device=dist.device)
        _, loss = forward(x, y)
        return torch.stack([loss.double(), torch.ones((), dtype=torch.float64, device=dist.device)])

    ks = range(dist.rank, config.eval_batches, dist.world_size)
    totals = evaluation_sums(model, ks, loss_and_count, size=2, device=dist.device, dtype=config.dtype)
    return (totals[0] / totals[1]).item()


def train(config: TrainConfig, *, on_checkpoint: Callable[[int], None] | None = None) -> dict | None:
    """Train one run (resuming ``<out>/runs/<name>/checkpoint.pt`` unless ``--no-resume``); append its record.

    One optimizer step is ``gradient_accumulation_steps`` micro-batches, micro-batch ``j`` of step ``i``
    drawn from ``(seed, i, j)`` and process ``r`` of ``W`` taking ``j = r, r + W, ...``
    (``app_common.harness.Trainer`` accumulates them, DDP synchronizing on the last), so any number of
    processes computes the one-process update. Works alone or in every process that ``torchrun`` started.

    Args:
        config: the run.
        on_checkpoint: called with the step after every checkpoint is written
            (``app_common.testing.kill_at`` raises there to stop the run as a kill would).

    Returns:
        The results record, or None when the run had already finished.

    Raises:
        ValueError: bad settings, data or checkpoint (another run's: the changed settings are listed);
            FileNotFoundError: no data or no pretrained folder; MemoryError: the run would not fit the
            device (``--memory-check``); RuntimeError: the training loss became NaN or infinite.
    """
    run = Run.from_config(config, label=run_label(config), on_save=on_checkpoint)
    return run.unless_finished(lambda run: _train(config, run))


def _train(config: TrainConfig, run: Run) -> dict:
    dist, device = run.dist, run.device
    if config.gradient_accumulation_steps % dist.world_size:
        raise ValueError(
            f"--gradient-accumulation-steps: {config.gradient_accumulation_steps} is not divisible by the "
            f"{dist.world_size} processes"
        )
    data = TokenData(config.data)
    planned = run_model_config(config, data.vocab_size)
    data.check_block_size(planned.block_size)
    if config.memory_check:
        check_fits(planned, config, device)
    model = build_model(config, data, device)
    optimizer = model.configure_optimizers(
        config.weight_decay, config.lr, (config.beta1, config.beta2), device.type
    )
    transfer = TransferResult()
    trainer = Trainer.from_config(
        config,
        run,
        model,
        optimizer,
        schedule=lr_schedule(config),
        state={"transfer": transfer},
        extra={"model_config": dataclasses.asdict(model.config), "tokenizer": data.meta},
        compile=config.compile,
    )
    if config.transfer_steps and not trainer.restore():
        transfer.report = transfer_attention(model, data, config, device)
        if dist.is_main:
            before, after = (
                sum(transfer.report[k]) / model.config.n_layer for k in ("mse_before", "mse_after")
            )
            print(
                f"{config.label}: attention transfer, mean per-layer MSE {before:.4g} -> {after:.4g} "
                f"after {transfer.report['steps']} steps"
            )
    block_size = model.config.block_size

    def loss(step: int, micro: int) -> torch.Tensor:
        x, y = data.batch(
            "train", config.batch_size, block_size, seed=(config.seed, step, micro), device=device
        )
        return trainer.forward(x, y)[1]

    tokens_per_step = config.gradient_accumulation_steps * config.batch_size * block_size
    if dist.is_main:
        print(
            f"{config.label}: {model.num_parameters() / 1e6:.2f}M parameters, "
            f"replaced {model.replaced or 'none'} ({config.start}), "
            f"{tokens_per_step} tokens per step, {device} {config.dtype}, {dist.world_size} process(es)"
        )
    # Evaluation runs on the module itself: under DDP every forward pass is a collective (buffer
    # broadcast), and the processes evaluate different numbers of batches.
    eval_model = trainer.eval_forward
    trainer.fit(
        loss,
        accumulate=config.gradient_accumulation_steps,
        evaluate=lambda step: {"val_loss": evaluate(eval_model, data, config, dist)},
    )
    val_loss = trainer.metrics["val_loss"]
    record = trainer.record(
        config,
        metrics={"val_loss": val_loss, "val_ppl": math.exp(val_loss)},
        details={
            "label": config.label,
            "layer": model.config.layer,
            "last_k": model.config.replaced_blocks,
            "replaced": model.replaced,
            "features": model.config.features,
            "init": config.start,
            "fits": ralimp.fit_summary(model),
            "layer_options": model.config.layer_options(),
            "attention": model.config.attention,
            "transfer": transfer.report,
            "weights": config.weights,
            "eval_batches": config.eval_batches,
            "tokens": trainer.step * tokens_per_step,
            "tokenizer": data.meta["tokenizer"],
            "vocab_size": data.vocab_size,
            "python": platform.python_version(),
            "log": str(run.log_path),
        },
    )
    if dist.is_main:
        print(
            f"{config.label}: val loss {val_loss:.4f}, perplexity {math.exp(val_loss):.3f} after "
            f"{trainer.step} steps ({trainer.train_seconds:.1f} s)"
        )
    return trainer.finish(record, results=config.results)


def load_model(path: str | Path, device: torch.device | str = "cpu") -> tuple[GPT, dict]:
    """The model of a run's ``checkpoint.pt`` and the checkpoint's tokenizer metadata.

    Raises:
        FileNotFoundError: no file at ``path``.
    """
    checkpoint = load_checkpoint(path, map_location=device)
    if checkpoint is None:
        raise FileNotFoundError(f"checkpoint: no file at {path}")
    model = GPT(GPTConfig(**checkpoint["model_config"]))
    for name, module in model.named_modules():
        # A RaLiMP started with init="lstsq" holds a fitted readout; the fresh layer gets one to load into.
        readout = checkpoint["model"].get(f"{name}.readout")
        if readout is not None and getattr(module, "readout", None) is None:
            module.set_readout(torch.zeros_like(readout))
    model.load_state_dict(checkpoint["model"])
    return model.to(device), checkpoint["tokenizer"]
