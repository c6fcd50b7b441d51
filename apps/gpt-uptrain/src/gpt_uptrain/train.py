"""``gpt-uptrain train``: nanoGPT's training loop with the paper's protocol, checkpoints and exact resume.

Top-down: build the model (from scratch, or from a local HF GPT-2 with the replacements applied after the
pretrained weights are in), AdamW, then iterate. One iteration is ``gradient_accumulation_steps``
micro-batches (split over the processes under ``torchrun``), one clipped AdamW step at the learning rate of
[`learning_rate`][gpt_uptrain.learning_rate] (linear warm-up, cosine decay to ``min_lr``). Every
``eval_interval`` iterations and at the end: validation loss over the same ``eval_iters`` batches, a log line
and a checkpoint. The final validation perplexity ``exp(mean loss)`` at the fixed budget ``max_iters`` goes to
the results file.

Reproducible by construction: micro-batch ``j`` of iteration ``i`` is drawn from ``(seed, i, j)``, process
``r`` of ``W`` takes micro-steps ``r, r + W, ...`` and DDP averages its gradients, so any number of
processes computes the one-process update; a checkpoint holds the model, optimizer, counters and every
process's random state, so ``--resume`` continues a killed run exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

import app_common as ac
from gpt_uptrain.config import TrainConfig
from gpt_uptrain.data import TokenData
from gpt_uptrain.model import GPT, GPTConfig

CHECKPOINT = "checkpoint.pt"
LOG = "log.jsonl"
EVAL_SEED = 20_240_607  # validation batches are the same for every run and every evaluation


def learning_rate(it: int, config: TrainConfig) -> float:
    """The schedule of nanoGPT: linear warm-up to ``learning_rate``, cosine to ``min_lr``.

    The cosine reaches ``min_lr`` at ``lr_decay_iters`` (``max_iters`` when None) and stays there.
    """
    decay_iters = config.lr_decay_iters or config.max_iters
    if it < config.warmup_iters:
        return config.learning_rate * (it + 1) / (config.warmup_iters + 1)
    if it >= decay_iters:
        return config.min_lr
    ratio = (it - config.warmup_iters) / (decay_iters - config.warmup_iters)
    return config.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (config.learning_rate - config.min_lr)


def model_config(config: TrainConfig, vocab_size: int) -> GPTConfig:
    """The [`GPTConfig`][gpt_uptrain.GPTConfig] of a run from scratch."""
    return GPTConfig(
        block_size=config.block_size,
        vocab_size=vocab_size,
        n_layer=config.n_layer,
        n_head=config.n_head,
        n_embd=config.n_embd,
        dropout=config.dropout,
        bias=config.bias,
        attention=config.attention,
        attention_features=config.attention_features,
        mlp=config.mlp,
        last_k=config.last_k,
        mlp_features=config.mlp_features,
        mlp_weight_matrix=config.mlp_weight_matrix,
        seed=config.seed,
    )


def build_model(config: TrainConfig, vocab_size: int) -> GPT:
    """The run's model: from scratch, or the HF GPT-2 of ``init_from`` with the run's changes.

    Raises:
        ValueError: the data's vocabulary does not fit the pretrained model's.
    """
    if config.init_from == "scratch":
        return GPT(model_config(config, vocab_size))
    model = GPT.from_pretrained(
        config.init_from,
        block_size=config.block_size,
        dropout=config.dropout,
        attention=config.attention,
        attention_features=config.attention_features,
        mlp=config.mlp,
        last_k=config.last_k,
        mlp_features=config.mlp_features,
        mlp_weight_matrix=config.mlp_weight_matrix,
        seed=config.seed,
    )
    if vocab_size > model.config.vocab_size:
        raise ValueError(
            f"data: its {vocab_size}-token vocabulary does not fit the pretrained model's "
            f"{model.config.vocab_size} "
            "(prepare it with --tokenizer gpt2)"
        )
    return model


def resolved_dtype(config: TrainConfig, device: torch.device) -> str:
    """``auto``: bfloat16 on a CUDA device that has it, else float32."""
    if config.dtype != "auto":
        return config.dtype
    return "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, data: TokenData, config: TrainConfig, dist: ac.Distributed, dtype: str
) -> float:
    """Mean validation loss over batches ``0 .. eval_iters - 1`` (the same in every run), split over ranks."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=dist.device)
    for k in range(dist.rank, config.eval_iters, dist.world_size):
        x, y = data.batch(
            "val", config.batch_size, config.block_size, seed=(EVAL_SEED, k), device=dist.device
        )
        with ac.autocast(dist.device, dtype):
            _, loss = model(x, y)
        totals += torch.stack([loss.double(), torch.ones((), dtype=torch.float64, device=dist.device)])
    ac.all_reduce(totals, "sum")
    model.train(was_training)
    return (totals[0] / totals[1]).item()


def _rewind_log(path: Path, it: int) -> None:
    """Drop the log lines written after iteration ``it`` (by a run killed after its last checkpoint)."""
    kept = [r for r in ac.read_jsonl(path, missing_ok=True) if r["iter"] <= it]
    path.unlink(missing_ok=True)
    for record in kept:
        ac.append_jsonl(path, record)


def _device_name(device: torch.device) -> str:
    return (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine()
    )


def train(config: TrainConfig, *, on_checkpoint: Callable[[int], None] | None = None) -> dict | None:
    """Train one run (resuming ``out/checkpoint.pt`` if ``config.resume``); append its record to the results.

    Works alone or in every process that ``torchrun`` started (DistributedDataParallel).

    Args:
        config: the run.
        on_checkpoint: called with the iteration after every checkpoint is written (an exception raised
            there stops the run as a kill would, with the checkpoint on disk).

    Returns:
        The results record, or None when the checkpoint says the run had already finished.

    Raises:
        ValueError: bad settings, data or checkpoint; FileNotFoundError: no data or no pretrained folder.
    """
    if config.threads:
        torch.set_num_threads(config.threads)
    dist = ac.setup_distributed(config.device)
    try:
        return _train(config, dist, on_checkpoint)
    finally:
        ac.teardown_distributed()


def _train(config: TrainConfig, dist: ac.Distributed, on_checkpoint) -> dict | None:
    device, out = dist.device, Path(config.out)
    if config.gradient_accumulation_steps % dist.world_size:
        raise ValueError(
            f"gradient_accumulation_steps: {config.gradient_accumulation_steps} is not divisible by the "
            f"{dist.world_size} processes"
        )
    local_steps = config.gradient_accumulation_steps // dist.world_size
    dtype = resolved_dtype(config, device)
    data = TokenData(config.data)

    ac.seed_everything(config.seed)
    model = build_model(config, data.vocab_size).to(device)
    optimizer = model.configure_optimizers(
        config.weight_decay, config.learning_rate, (config.beta1, config.beta2), device.type
    )
    state = {"iter": 0, "train_time": 0.0, "val_loss": None, "finished": False}
    checkpoint = ac.load_checkpoint(out / CHECKPOINT, map_location=device) if config.resume else None
    if checkpoint is not None:
        if checkpoint["model_config"] != dataclasses.asdict(model.config):
            raise ValueError(
                f"resume: {out / CHECKPOINT} holds a different model ({checkpoint['model_config']}); "
                "use another --out or the same settings"
            )
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        state = checkpoint["state"]
        rngs = checkpoint["rng"]
        if len(rngs) == dist.world_size:
            ac.set_rng_state(rngs[dist.rank])
        if state["finished"]:
            if dist.is_main:
                print(f"{out}: already finished ({state['iter']} iterations); nothing to do")
            return None
        if dist.is_main:
            _rewind_log(out / LOG, state["iter"])
    elif dist.is_main:
        (out / LOG).unlink(missing_ok=True)

    raw_model = model
    if config.compile:
        model = torch.compile(model)
    # Evaluation runs on the module itself: under DDP every forward pass is a collective (buffer
    # broadcast), and the processes evaluate different numbers of batches.
    eval_model = model
    if dist.enabled:
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    def save(finished: bool = False) -> None:
        state["finished"] = finished
        rngs = ac.all_gather_object(ac.rng_state())
        if dist.is_main:
            ac.save_checkpoint(
                out / CHECKPOINT,
                {
                    "model": raw_model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "state": dict(state),
                    "rng": rngs,
                    "model_config": dataclasses.asdict(raw_model.config),
                    "config": ac.config_dict(config),
                    "tokenizer": data.meta,
                },
            )
        ac.barrier()

    tokens_per_iter = config.gradient_accumulation_steps * config.batch_size * config.block_size
    if dist.is_main:
        print(
            f"{config.label}: {raw_model.num_parameters() / 1e6:.2f}M parameters, "
            f"replaced {raw_model.replaced or 'none'}, "
            f"{tokens_per_iter} tokens per iteration, {device} {dtype}, {dist.world_size} process(es)"
        )
    model.train()
    timer = ac.Timer(device, elapsed=state["train_time"])
    timer.start()
    bar = ac.progress(
        total=config.max_iters, initial=state["iter"], desc=config.label, disable=not dist.is_main
    )
    for it in range(state["iter"], config.max_iters):
        lr = learning_rate(it, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        total = torch.zeros((), device=device)
        for step in range(local_steps):
            micro = dist.rank + step * dist.world_size
            x, y = data.batch(
                "train", config.batch_size, config.block_size, seed=(config.seed, it, micro), device=device
            )
            sync = step == local_steps - 1 or not dist.enabled
            with contextlib.nullcontext() if sync else model.no_sync(), ac.autocast(device, dtype):
                _, loss = model(x, y)
                loss = loss / local_steps
            loss.backward()
            total += loss.detach()
        if config.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        train_loss = ac.all_reduce(total, "mean").item()
        if not math.isfinite(train_loss):
            raise RuntimeError(f"{config.label}: the training loss became {train_loss} at iteration {it + 1}")
        state["iter"] = it + 1
        bar.update(1)
        bar.set_postfix(loss=f"{train_loss:.4f}", lr=f"{lr:.2e}")
        if dist.is_main and ((it + 1) % config.log_interval == 0 or it == 0):
            ac.append_jsonl(out / LOG, {"iter": it + 1, "train_loss": train_loss, "lr": lr})
        if (it + 1) % config.eval_interval == 0 or it + 1 == config.max_iters:
            state["train_time"] = timer.stop()
            state["val_loss"] = evaluate(eval_model, data, config, dist, dtype)
            if dist.is_main:
                ac.append_jsonl(out / LOG, {"iter": it + 1, "val_loss": state["val_loss"]})
                bar.write(f"{config.label}: iteration {it + 1}: val loss {state['val_loss']:.4f}")
            save()
            if on_checkpoint is not None:
                on_checkpoint(it + 1)
            timer.start()
    bar.close()
    state["train_time"] = timer.stop()

    peak = ac.peak_memory(device)
    peak_bytes = int(ac.all_reduce(torch.tensor([float(peak.bytes)], device=device), "max").item())
    record = {
        "run": config.label,
        "mlp": raw_model.config.mlp,
        "last_k": raw_model.config.replaced_blocks,
        "replaced": raw_model.replaced,
        "mlp_features": raw_model.config.mlp_features,
        "attention": raw_model.config.attention,
        "init_from": config.init_from,
        "val_loss": state["val_loss"],
        "val_ppl": math.exp(state["val_loss"]),
        "eval_batches": config.eval_iters,
        "iters": state["iter"],
        "tokens": state["iter"] * tokens_per_iter,
        "train_time_s": state["train_time"],
        "peak_memory_bytes": peak_bytes,
        "memory_kind": peak.kind,
        "num_parameters": raw_model.num_parameters(),
        "tokenizer": data.meta["tokenizer"],
        "vocab_size": data.vocab_size,
        "device": _device_name(device),
        "dtype": dtype,
        "world_size": dist.world_size,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "log": str(out / LOG),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": ac.config_dict(config),
    }
    if dist.is_main:
        ac.append_jsonl(config.results, record)
        print(
            f"{config.label}: val loss {state['val_loss']:.4f}, perplexity {record['val_ppl']:.3f} after "
            f"{state['iter']} iterations ({state['train_time']:.1f} s)"
        )
    save(finished=True)
    return record


def load_model(path: str | Path, device: torch.device | str = "cpu") -> tuple[GPT, dict]:
    """The model of a run's ``checkpoint.pt`` and the checkpoint's tokenizer metadata.

    Raises:
        FileNotFoundError: no file at ``path``.
    """
    checkpoint = ac.load_checkpoint(path, map_location=device)
    if checkpoint is None:
        raise FileNotFoundError(f"checkpoint: no file at {path}")
    model = GPT(GPTConfig(**checkpoint["model_config"]))
    model.load_state_dict(checkpoint["model"])
    return model.to(device), checkpoint["tokenizer"]
