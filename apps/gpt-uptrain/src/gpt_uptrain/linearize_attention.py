"""``gpt-uptrain linearize-attention``: a trained softmax GPT's attention converted to random features.

The teacher is the softmax model of ``quick`` (trained here on the offline stdlib corpus, or reused from
``--out``), or a local HF GPT-2 folder (``--weights``). Only the attention is converted (the MLPs stay
dense). For each random-feature pair (``--attention``):

- **swap**: the teacher with its attention swapped for the pair, no training;
- **swap + fine-tune**: ``--steps`` steps of next-token training of the whole model (the feature maps,
  learnable in every variant, included);
- **transfer + fine-tune**: ``--transfer-steps`` of attention transfer (only the feature maps train, each
  layer matching softmax on its own ``q, k, v``), then ``steps - transfer_steps`` of fine-tuning: the same
  total number of steps.

The trained variants are a grid of ordinary ``gpt-uptrain train`` runs (pair x variant) run by
[`app_common.grid.run_grid`][app_common.grid.run_grid]: each has its run folder named from its identity, a
finished run is reused, an interrupted one resumes, ``--shard i/n`` splits the grid over processes. The
report is made from their records: per pair each variant's validation loss, the share of the
swap-to-teacher gap it closes, ``(swap - x) / (swap - teacher)``, the per-layer transfer MSE before and
after, and the decode speed (ms per generated token, one thread) of the converted model against the
teacher's: ``GPT.generate`` with the RF O(1) state against the teacher's KV cache, from the same prompt.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from app_common.device import resolve_device
from app_common.distributed import Distributed
from app_common.fields import OutputFields, RuntimeFields, check_int_fields, option
from app_common.grid import GridFields, run_grid
from app_common.records import CHECKPOINT, finished_record, run_dir
from app_common.records import RESULTS as RUN_RESULTS
from app_common.results import append_jsonl, write_table
from gpt_uptrain import hf
from gpt_uptrain.config import QUICK_RUN, TrainConfig
from gpt_uptrain.data import TokenData
from gpt_uptrain.model import GPT, is_random_feature
from gpt_uptrain.quick import quick_data
from gpt_uptrain.train import build_model, evaluate, load_model, run_name, train

#: The pairs compared by default: one per component function with positive features (posrf, oprf, gerf,
#: saderf, posrf-hyp; attention transfer refuses trigrf's signed features).
PAIRS = ("posrf-orf", "oprf-fastfoodl", "gerf-orf", "saderf-orf", "posrf-hyp-orf")
#: The three variants, in the report's order.
VARIANTS = ("swap", "swap_finetune", "transfer_finetune")
#: The per-pair summaries (one JSON line per pair, rewritten from the runs' records by each call) and the
#: table (``.md`` and ``.csv``), under ``--out``.
RESULTS, TABLE = "linearize-attention.jsonl", "linearize-attention"
#: The teacher as an HF GPT-2 folder under ``--out`` (the variants load it with ``--weights``).
TEACHER = "teacher"


@dataclass(frozen=True, kw_only=True)
class LinearizeAttentionConfig(RuntimeFields, OutputFields, GridFields):
    """``gpt-uptrain linearize-attention``: swap, swap + fine-tune and transfer + fine-tune for each pair.

    The runs are `QUICK_RUN`'s settings (batches, schedule shape, evaluation) with the teacher's weights
    and the flags given here; each run's identity (its folder's name) is `gpt_uptrain.train.run_name`'s,
    as for every ``train`` run.
    """

    out: Path = option("out", Path("runs/gpt-uptrain-linearize-attention"), help="and of data/ and teacher/")
    weights: str = option(
        "weights", "scratch", help="'scratch' (train the quick softmax teacher), or a local HF GPT-2 folder"
    )
    data: Path | None = field(
        default=None,
        metadata={"help": "train.bin/val.bin/meta.json folder (default: the stdlib corpus in out/data)"},
    )
    attention: tuple[str, ...] = option("attention", PAIRS, help="RF pairs, a comparison each")
    attention_features: int = option("attention_features", 64)
    teacher_steps: int = field(
        default=QUICK_RUN.steps, metadata={"help": "training steps of the softmax teacher (scratch only)"}
    )
    teacher_layers: int = field(default=QUICK_RUN.model.n_layer, metadata={"help": "teacher's blocks"})
    teacher_heads: int = field(default=QUICK_RUN.model.n_head, metadata={"help": "teacher's heads"})
    teacher_width: int = field(default=QUICK_RUN.model.n_embd, metadata={"help": "teacher's width"})
    teacher_lr: float = field(default=QUICK_RUN.lr, metadata={"help": "teacher's peak learning rate"})
    context: int = field(
        default=QUICK_RUN.model.block_size,
        metadata={"help": "tokens per sequence: the teacher's context and every variant's"},
    )
    batch_size: int = field(
        default=QUICK_RUN.batch_size, metadata={"help": "sequences per micro-step (teacher and variants)"}
    )
    gradient_accumulation_steps: int = field(
        default=QUICK_RUN.gradient_accumulation_steps, metadata={"help": "micro-steps per optimizer step"}
    )
    steps: int = option("steps", 30, help="each variant's budget, transfer steps included")
    transfer_steps: int = field(default=15, metadata={"help": "attention transfer steps (of --steps)"})
    transfer_lr: float = field(default=3e-2, metadata={"help": "AdamW learning rate of attention transfer"})
    lr: float = option("lr", 3e-4, help="peak fine-tuning learning rate (the teacher's is quick's)")
    eval_batches: int = option("eval_batches", QUICK_RUN.eval_batches)
    corpus_chars: int = field(default=1_000_000, metadata={"help": "characters of stdlib source"})
    prompt_tokens: int = field(default=32, metadata={"help": "prompt length of the decode-speed measure"})
    new_tokens: int = field(default=32, metadata={"help": "tokens generated by the decode-speed measure"})
    seed: int = option("seed", QUICK_RUN.seed)
    threads: int = option("threads", 1, help="the models are small: more threads only contend")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int_fields(self, "attention_features", "teacher_steps", "steps", "eval_batches")
        check_int_fields(self, "teacher_layers", "teacher_heads", "teacher_width", "context")
        check_int_fields(self, "batch_size", "gradient_accumulation_steps")
        check_int_fields(self, "prompt_tokens", "new_tokens")
        check_int_fields(self, "transfer_steps", minimum=0)
        if self.transfer_steps >= self.steps:
            raise ValueError(
                f"--transfer-steps: expected fewer than --steps={self.steps} (they count against it), "
                f"got {self.transfer_steps}"
            )
        bad = [name for name in self.attention if not is_random_feature(name)]
        if bad or not self.attention:
            raise ValueError(f"--attention: expected RF pairs ('<component>-<matrix>'), got {bad}")

    @property
    def runtime(self) -> dict[str, Any]:
        """``resume``, ``device``, ``dtype`` and ``threads``: what every run of the experiment shares."""
        return {k: getattr(self, k) for k in ("resume", "device", "dtype", "threads")}

    def variant(self, pair: str, variant: str, data: Path, teacher: Path) -> TrainConfig:
        """The `TrainConfig` of a fine-tuning variant of ``pair``, starting from the ``teacher`` folder.

        Every variant has the same learnable per-head feature maps (initialized by the same draws), so the
        variants differ only in the transfer stage. The context is quick's, or the teacher's when shorter.
        """
        transfer = self.transfer_steps if variant == "transfer_finetune" else 0
        steps = self.steps - transfer
        context = hf.gpt2_config_fields(hf.read_config(teacher))["block_size"]
        return dataclasses.replace(
            QUICK_RUN,
            data=data,
            out=Path(self.out),
            results=Path(self.out) / RUN_RESULTS,
            name=f"{pair} {variant}",
            weights=str(teacher),
            model=dataclasses.replace(
                QUICK_RUN.model,
                block_size=min(context, QUICK_RUN.model.block_size),
                attention=pair,
                attention_features=self.attention_features,
                learnable_attention=True,
                seed=self.seed,
            ),
            steps=steps,
            transfer_steps=transfer,
            transfer_lr=self.transfer_lr,
            warmup_steps=max(1, round(0.05 * steps)),
            lr=self.lr,
            min_lr=self.lr / 10,
            eval_every=steps,
            eval_batches=self.eval_batches,
            **self.runtime,
        )


def teacher_run(config: LinearizeAttentionConfig, data: Path) -> TrainConfig:
    """The `TrainConfig` of the softmax teacher trained from scratch (``--weights scratch``).

    `QUICK_RUN`'s optimizer and schedule shape (warm-up 5 % of the steps, final rate ``lr / 10``) with
    the ``teacher_*`` sizes, ``context`` and the batch of ``config``; dense MLPs, softmax attention.
    """
    return dataclasses.replace(
        QUICK_RUN,
        data=data,
        out=Path(config.out),
        results=Path(config.out) / RUN_RESULTS,
        name="teacher",
        model=dataclasses.replace(
            QUICK_RUN.model,
            block_size=config.context,
            n_layer=config.teacher_layers,
            n_head=config.teacher_heads,
            n_embd=config.teacher_width,
            seed=config.seed,
        ),
        batch_size=config.batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        steps=config.teacher_steps,
        warmup_steps=max(1, round(0.05 * config.teacher_steps)),
        lr=config.teacher_lr,
        min_lr=config.teacher_lr / 10,
        eval_every=max(1, config.teacher_steps // 6),
        eval_batches=config.eval_batches,
        **config.runtime,
    )


def prepare_teacher(config: LinearizeAttentionConfig) -> tuple[Path, Path]:
    """The data folder and the teacher's HF folder: ``--weights``, or `teacher_run` (trained once)."""
    out = Path(config.out)
    data = config.data if config.data is not None else quick_data(out / "data", config.corpus_chars)
    if config.weights != "scratch":
        return data, Path(config.weights)
    teacher = out / TEACHER
    if not (teacher / "config.json").is_file():
        run = teacher_run(config, data)
        train(run)
        model, _ = load_model(run_dir(out, run_name(run)) / CHECKPOINT)
        hf.save_pretrained(model, teacher)
    return data, teacher


@torch.no_grad()
def decode_ms(model: GPT, data: TokenData, config: LinearizeAttentionConfig, device: torch.device) -> float:
    """Milliseconds per token of sampling with ``model.generate`` from a validation prompt.

    The prompt is ``prompt_tokens`` tokens (cropped so that prompt and ``new_tokens`` fit the context);
    one untimed call first, then the time of one call over ``new_tokens`` (prefill included).
    """
    model.eval()
    prompt_tokens = max(1, min(config.prompt_tokens, model.config.block_size - config.new_tokens))
    prompt, _ = data.batch("val", 1, prompt_tokens, seed=(config.seed, 0), device=device)
    generator = torch.Generator(device=device).manual_seed(config.seed)
    model.generate(prompt, 2, generator=generator)
    start = time.perf_counter()
    model.generate(prompt, config.new_tokens, generator=generator)
    return 1000 * (time.perf_counter() - start) / config.new_tokens


def gap_closed(swap: float, teacher: float, value: float) -> float:
    """``100 (swap - value) / (swap - teacher)``: the share of the swap-to-teacher loss gap closed, in %."""
    return 100 * (swap - value) / (swap - teacher)


def variant_runs(
    config: LinearizeAttentionConfig, data: Path, teacher: Path
) -> dict[tuple[str, str], TrainConfig]:
    """The grid's cells by ``(pair, variant)``: the trained variants, pair by pair, in `VARIANTS` order."""
    return {
        (pair, v): config.variant(pair, v, data, teacher) for pair in config.attention for v in VARIANTS[1:]
    }


def _place(run: TrainConfig) -> tuple[Path, str]:
    """A variant's ``(out, run name)`` for `run_grid`."""
    return Path(run.out), run_name(run)


def convert_pair(
    config: LinearizeAttentionConfig,
    pair: str,
    records: dict[str, dict[str, Any]],
    context: tuple[TokenData, Path, Path, float, float],
) -> dict[str, Any]:
    """The report's record of ``pair`` from its variants' run ``records`` (see the module's description).

    ``context``: the tokens, data folder, teacher folder, teacher's validation loss and decode ms.
    """
    tokens, data, teacher, teacher_loss, teacher_ms = context
    swap_config = config.variant(pair, "swap_finetune", data, teacher)
    device = resolve_device(config.device)
    swapped = build_model(swap_config, tokens, device)
    swap = evaluate(swapped, tokens, swap_config, Distributed(device=device))
    loss = {"swap": swap, **{v: r["metrics"]["val_loss"] for v, r in records.items()}}
    transfer = records["transfer_finetune"]["details"]["transfer"]
    before, after = transfer["mse_before"], transfer["mse_after"]
    converted_run = run_dir(config.out, run_name(config.variant(pair, "transfer_finetune", data, teacher)))
    converted, _ = load_model(converted_run / CHECKPOINT, device)
    return {
        "pair": pair,
        "teacher_val_loss": teacher_loss,
        "val_loss": loss,
        "gap_closed": {v: gap_closed(swap, teacher_loss, loss[v]) for v in VARIANTS[1:]},
        "steps": {
            v: {"transfer": r["details"]["transfer"].get("steps", 0), "finetune": r["steps"]}
            for v, r in records.items()
        },
        "mse_before": before,
        "mse_after": after,
        "mse_cut": [100 * (1 - a / b) for b, a in zip(before, after, strict=True)],
        "decode_ms": {"teacher": teacher_ms, "converted": decode_ms(converted, tokens, config, device)},
        "attention_features": config.attention_features,
    }


#: The table's columns.
HEADER = (
    "pair",
    "swap",
    "swap + FT",
    "transfer + FT",
    "gap closed: swap + FT",
    "gap closed: transfer + FT",
    "transfer MSE per layer, before -> after (cut)",
    "ms/token RF (teacher)",
)


def table_rows(summaries: list[dict[str, Any]]) -> list[list[str]]:
    """One row of `HEADER` per pair's summary."""
    rows = []
    for r in summaries:
        loss, closed, ms = r["val_loss"], r["gap_closed"], r["decode_ms"]
        layers = zip(r["mse_before"], r["mse_after"], r["mse_cut"], strict=True)
        rows.append(
            [
                r["pair"],
                f"{loss['swap']:.4f}",
                f"{loss['swap_finetune']:.4f}",
                f"{loss['transfer_finetune']:.4f}",
                f"{closed['swap_finetune']:.1f}%",
                f"{closed['transfer_finetune']:.1f}%",
                "; ".join(f"{b:.3g} -> {a:.3g} ({c:.0f}%)" for b, a, c in layers),
                f"{ms['converted']:.2f} ({ms['teacher']:.2f})",
            ]
        )
    return rows


def linearize_attention(config: LinearizeAttentionConfig) -> str:
    """Run this shard's variants (finished runs reused) and report the pairs whose runs are all finished.

    Returns the Markdown table (also ``out/linearize-attention.md`` and ``.csv``, with the summaries in
    ``out/linearize-attention.jsonl``), followed by the teacher's validation loss.
    """
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    if config.threads:
        torch.set_num_threads(config.threads)
    data, teacher = prepare_teacher(config)
    runs = variant_runs(config, data, teacher)
    run_grid(
        list(runs.values()),
        train,
        place=_place,
        grid=config,
        resume=config.resume,
        desc="linearize-attention",
    )
    finished = {cell: finished_record(*_place(run)) for cell, run in runs.items()}
    device = resolve_device(config.device)
    tokens = TokenData(data)
    reference = config.variant(config.attention[0], "swap_finetune", data, teacher)
    teacher_model = GPT.from_pretrained(teacher, block_size=reference.model.block_size).to(device)
    teacher_loss = evaluate(teacher_model, tokens, reference, Distributed(device=device))
    context = (tokens, data, teacher, teacher_loss, decode_ms(teacher_model, tokens, config, device))
    summaries = []
    for pair in config.attention:
        records = {v: finished[(pair, v)] for v in VARIANTS[1:]}
        if any(record is None for record in records.values()):
            print(f"{pair}: not every variant has finished (another shard's, or failed): left out")
            continue
        summaries.append(convert_pair(config, pair, records, context))  # type: ignore[arg-type]
    (out / RESULTS).write_text("", encoding="utf-8")
    for summary in summaries:
        append_jsonl(out / RESULTS, summary)
    text = write_table(out / TABLE, HEADER, table_rows(summaries))
    return f"{text}\n\nTeacher (softmax) validation loss: {teacher_loss:.4f}.\n"
