"""``gpt-uptrain linearize-attention``: a trained softmax GPT's attention converted to feature-map attention.

The teacher is a softmax GPT trained here once on the offline stdlib corpus (`teacher_run`, saved as an
HF GPT-2 folder under ``--out``), or a local HF GPT-2 folder (``--weights``). Only the attention is
converted (the MLPs stay dense). Each **row** is an attention (``--attention``: a random-feature pair
``<component>-<matrix>``, or a learned map, ``hedgehog`` or ``t2r``) with a sliding window (``--windows``,
0: none; a learned map's window is mixed in by LoLCATs' learned factor), and has three **variants**:

- **swap**: the teacher with its attention swapped for the row's, no training;
- **swap + fine-tune**: ``--steps`` steps of next-token training of the whole model (the feature maps,
  learnable in every variant, included);
- **transfer + fine-tune**: ``--transfer-steps`` of attention transfer (only the feature maps train, each
  layer matching softmax on its own ``q, k, v``), then ``steps - transfer_steps`` of fine-tuning: the same
  total number of steps. A row whose maps attention transfer refuses (TrigRF's signed features) has this
  cell recorded as refused, with the reason, and its other variants run.

Each variant runs once per seed of ``--seeds`` (the feature draws and the batch order; the teacher is one
model). The trained variants are a grid of ordinary ``gpt-uptrain train`` runs (row x seed x variant), run
by [`app_common.grid.run_grid`][app_common.grid.run_grid]: each has its run folder named from its
identity, a finished run is reused, an interrupted one resumes, ``--shard i/n`` splits the grid over
processes. The report is made from their records for the rows whose runs have all finished (the others
are listed as missing): per row each variant's validation loss (mean over seeds), the share of the
swap-to-teacher gap it closes, ``(swap - x) / (swap - teacher)`` (mean and spread, max - min over seeds),
transfer + FT's loss less swap + FT's against the run-to-run spread, the per-layer cut of the transfer's
MSE, and the decode speed (ms per generated token, one thread) at each context of ``--decode-contexts``.
Beside them the teacher's validation loss and its mean attention entropy per layer, which says how peaked
the attention is that the rows imitate.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import rf_attention
from app_common.device import resolve_device
from app_common.distributed import Distributed
from app_common.fields import OutputFields, RuntimeFields, check_int_fields, option
from app_common.grid import GridFields, run_grid
from app_common.plots import pyplot, save_figure
from app_common.records import CHECKPOINT, finished_record, run_dir
from app_common.records import RESULTS as RUN_RESULTS
from app_common.results import append_jsonl, write_table
from gpt_uptrain import hf
from gpt_uptrain.config import QUICK_RUN, TrainConfig
from gpt_uptrain.data import TokenData
from gpt_uptrain.model import GPT, GPTConfig, has_feature_map
from gpt_uptrain.quick import quick_data
from gpt_uptrain.train import EVAL_SEED, build_model, evaluate, load_model, run_name, train

#: The attentions compared by default: each component family with orthogonal rows (TrigRF's transfer is
#: refused), OPRF with the learned FastFood matrix, and the learned-map baseline of LoLCATs.
ATTENTIONS = ("trigrf-orf", "posrf-orf", "gerf-orf", "oprf-orf", "saderf-orf", "oprf-fastfoodl", "hedgehog")
#: The three variants, in the report's order; the last two are trained.
VARIANTS = ("swap", "swap_finetune", "transfer_finetune")
TRAINED = VARIANTS[1:]
#: Under ``--out``: the per-row summaries (one JSON line per reported row, rewritten by each call), the
#: table (``.md`` with its caption, and ``.csv``), the plot, and the measurements that do not come from
#: a run's record (swap losses, the teacher's loss and entropy, decode times), kept so that a rerun of
#: the report does not measure them again (delete the file to measure anew).
RESULTS, TABLE, PLOT = "linearize-attention.jsonl", "linearize-attention", "linearize-attention.png"
MEASURED = "linearize-attention-measured.json"
#: The teacher as an HF GPT-2 folder under ``--out`` (the variants load it with ``--weights``).
TEACHER = "teacher"

#: A row of the comparison: ``(attention, window)``.
Row = tuple[str, int]
#: A trained cell of the grid: ``(attention, window, seed, variant)``.
Cell = tuple[str, int, int, str]


@dataclass(frozen=True, kw_only=True)
class LinearizeAttentionConfig(RuntimeFields, OutputFields, GridFields):
    """``gpt-uptrain linearize-attention``: swap, swap + fine-tune and transfer + fine-tune for each row.

    The runs are `QUICK_RUN`'s settings (optimizer, schedule shape) with the teacher's weights, this
    config's ``context``, batch and the flags given here; each run's identity (its folder's name) is
    `gpt_uptrain.train.run_name`'s, as for every ``train`` run.
    """

    out: Path = option("out", Path("runs/gpt-uptrain-linearize-attention"), help="and of data/ and teacher/")
    weights: str = option(
        "weights", "scratch", help="'scratch' (train the quick softmax teacher), or a local HF GPT-2 folder"
    )
    data: Path | None = field(
        default=None,
        metadata={"help": "train.bin/val.bin/meta.json folder (default: the stdlib corpus in out/data)"},
    )
    attention: tuple[str, ...] = option(
        "attention", ATTENTIONS, help="RF pairs or learned maps (hedgehog, t2r): the rows, with --windows"
    )
    windows: tuple[int, ...] = field(
        default=(0,),
        metadata={"help": "sliding windows of exact softmax (0: none): a row per attention each"},
    )
    attention_features: int = option("attention_features", 64)
    input_map: bool = field(
        default=True,
        metadata={"help": "per-head learned linear maps of q and k before the features (identity at start)"},
    )
    seeds: tuple[int, ...] = field(
        default=(QUICK_RUN.seed,),
        metadata={"help": "seeds of the variants (feature draws, batch order); the teacher is one model"},
    )
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
    transfer_lr: float = field(
        default=rf_attention.transfer.DEFAULT_LR,
        metadata={"help": "peak learning rate of attention transfer (AdamW, warm-up and cosine decay)"},
    )
    lr: float = option("lr", 3e-4, help="peak fine-tuning learning rate (the teacher's is --teacher-lr)")
    eval_batches: int = option("eval_batches", QUICK_RUN.eval_batches)
    entropy_batches: int = field(
        default=4, metadata={"help": "validation batches of the teacher's attention entropy"}
    )
    corpus_chars: int = field(default=1_000_000, metadata={"help": "characters of stdlib source"})
    decode_contexts: tuple[int, ...] = field(
        default=(512, 8192),
        metadata={"help": "contexts of the decode-speed measure (the prompt fills all but --new-tokens)"},
    )
    new_tokens: int = field(default=32, metadata={"help": "tokens timed by the decode-speed measure"})
    plot: Path | None = field(
        default=None,
        metadata={"help": "where the gap-closed plot goes (default: out/linearize-attention.png)"},
    )
    seed: int = option("seed", QUICK_RUN.seed, help="the teacher's (scratch) and the decode prompts'")
    threads: int = option("threads", 1, help="the models are small: more threads only contend")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int_fields(self, "attention_features", "teacher_steps", "steps", "eval_batches")
        check_int_fields(self, "teacher_layers", "teacher_heads", "teacher_width", "context")
        check_int_fields(self, "batch_size", "gradient_accumulation_steps", "entropy_batches")
        check_int_fields(self, "new_tokens", "decode_contexts")
        check_int_fields(self, "transfer_steps", "windows", "seeds", minimum=0)
        if self.transfer_steps >= self.steps:
            raise ValueError(
                f"--transfer-steps: expected fewer than --steps={self.steps} (they count against it), "
                f"got {self.transfer_steps}"
            )
        bad = [name for name in self.attention if not has_feature_map(name)]
        if bad or not self.attention:
            raise ValueError(
                f"--attention: expected RF pairs ('<component>-<matrix>') or learned maps (hedgehog, t2r), "
                f"got {bad or list(self.attention)}"
            )
        for name in ("windows", "seeds", "decode_contexts"):
            values = getattr(self, name)
            if not values or len(set(values)) != len(values):
                raise ValueError(f"--{name.replace('_', '-')}: expected distinct values, got {list(values)}")
        covering = [w for w in self.windows if w >= self.context]
        if covering:
            raise ValueError(
                f"--windows: expected windows shorter than --context={self.context} (a window over the whole "
                f"context leaves the feature maps nothing to do), got {covering}"
            )
        short = [c for c in self.decode_contexts if c < self.new_tokens + 2]
        if short:
            raise ValueError(
                f"--decode-contexts: expected contexts of at least --new-tokens + 2 = {self.new_tokens + 2} "
                f"(a prompt, then the timed tokens), got {short}"
            )

    @property
    def runtime(self) -> dict[str, Any]:
        """``resume``, ``device``, ``dtype`` and ``threads``: what every run of the experiment shares."""
        return {k: getattr(self, k) for k in ("resume", "device", "dtype", "threads")}

    @property
    def rows(self) -> list[Row]:
        """The ``(attention, window)`` rows, attention by attention."""
        return [(attention, window) for attention in self.attention for window in self.windows]

    def variant(self, row: Row, seed: int, variant: str, data: Path, teacher: Path) -> TrainConfig:
        """The `TrainConfig` of a fine-tuning variant of ``row`` at ``seed``, starting from ``teacher``.

        Every variant has the same learnable per-head feature maps (initialized by the seed's draws), so
        the variants of a seed differ only in the transfer stage. ``context`` and the batch are this
        config's (the teacher's). A swap + FT run has no transfer stage: it carries the library's default
        transfer lr, unused, so that its identity (and a finished run's reuse) does not depend on
        ``--transfer-lr``.
        """
        attention, window = row
        transfer = self.transfer_steps if variant == "transfer_finetune" else 0
        steps = self.steps - transfer
        return dataclasses.replace(
            QUICK_RUN,
            data=data,
            out=Path(self.out),
            results=Path(self.out) / RUN_RESULTS,
            name=f"{attention} window {window} seed {seed} {variant}",
            weights=str(teacher),
            model=dataclasses.replace(
                QUICK_RUN.model,
                block_size=self.context,
                attention=attention,
                attention_window=window,
                attention_features=self.attention_features,
                learnable_attention=True,
                attention_input_map=self.input_map,
                seed=seed,
            ),
            batch_size=self.batch_size,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            steps=steps,
            transfer_steps=transfer,
            transfer_lr=self.transfer_lr if transfer else rf_attention.transfer.DEFAULT_LR,
            warmup_steps=max(1, round(0.05 * steps)),
            lr=self.lr,
            min_lr=self.lr / 10,
            eval_every=steps,
            eval_batches=self.eval_batches,
            **self.runtime,
        )


def teacher_finetune_run(
    config: LinearizeAttentionConfig, seed: int, data: Path, teacher: Path
) -> TrainConfig:
    """The teacher fine-tuned like a swap + FT variant (same steps, schedule, batches at ``seed``): softmax.

    The reference a converted model's fine-tuning is measured against: a teacher that is not trained to
    convergence also gains from those steps, so a variant can pass the teacher's own loss.
    """
    swap = config.variant(config.rows[0], seed, "swap_finetune", data, teacher)
    return dataclasses.replace(
        swap,
        name=f"softmax seed {seed} finetune",
        model=dataclasses.replace(
            swap.model,
            attention="softmax",
            attention_window=0,
            learnable_attention=False,
            attention_input_map=False,
        ),
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


def transfer_refusal(attention: str, window: int) -> str | None:
    """Why attention transfer refuses ``attention``'s feature maps (with ``window``), or None.

    Asked of [`attention_transfer`][rf_attention.transfer.attention_transfer] itself: one step on a
    one-block model of that attention (width 8) over ``window + 2`` tokens (so that some fall outside the
    window, where the maps act); its ``ValueError``'s message is the reason.
    """
    tokens = window + 2
    probe = GPT(
        GPTConfig(
            block_size=tokens,
            vocab_size=2,
            n_layer=1,
            n_head=1,
            n_embd=8,
            attention=attention,
            attention_window=window,
            attention_features=4,
            learnable_attention=True,
        )
    )
    try:
        rf_attention.transfer.attention_transfer(probe, [torch.zeros(1, tokens, dtype=torch.long)], steps=1)
    except ValueError as error:
        return str(error)
    return None


def variant_runs(
    config: LinearizeAttentionConfig, data: Path, teacher: Path, refused: dict[Row, str | None]
) -> dict[Cell, TrainConfig]:
    """The grid's cells: row by row, seed by seed, the trained variants (a refused transfer left out)."""
    return {
        (*row, seed, v): config.variant(row, seed, v, data, teacher)
        for row in config.rows
        for seed in config.seeds
        for v in TRAINED
        if not (v == "transfer_finetune" and refused[row])
    }


def _place(run: TrainConfig) -> tuple[Path, str]:
    """A variant's ``(out, run name)`` for `run_grid`."""
    return Path(run.out), run_name(run)


# ------------------------------------------------------------------------------------ measurements
def measured(path: Path, key: str, measure: Callable[[], Any]) -> Any:
    """The value stored under ``key`` in the JSON file ``path``, or ``measure()``'s, stored there first.

    The file is replaced whole (written beside it, then renamed), so a reader never sees half of it.
    """
    values = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    if key not in values:
        values[key] = measure()
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(values, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        partial.replace(path)
    return values[key]


def causal_attention_entropy(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    r"""Each query's attention entropy $-\sum_{j \le i} p_{ij} \log p_{ij}$ (nats), in float64.

    $p_i = \operatorname{softmax}_{j \le i}(s\, q_i \cdot k_j)$, causal softmax attention with logit scale
    $s$ (``scale``, $D_h^{-1/2}$ by default, the teacher's). A plain reference: the ``N x N`` scores are
    formed.

    Args:
        q: ``(..., N, Dh)`` queries.
        k: ``(..., N, Dh)`` keys.
        scale: the logit scale ``s``.

    Returns:
        ``(..., N)`` float64; query ``i`` of uniform attention has ``log(i + 1)``.
    """
    s = q.shape[-1] ** -0.5 if scale is None else scale
    scores = s * (q.double() @ k.double().transpose(-1, -2))
    n = scores.shape[-1]
    future = torch.ones(n, n, dtype=torch.bool, device=scores.device).triu(1)
    log_p = torch.log_softmax(scores.masked_fill(future, -math.inf), dim=-1).masked_fill(future, 0.0)
    return -(log_p.exp().masked_fill(future, 0.0) * log_p).sum(-1)


def uniform_causal_entropy(n: int) -> float:
    """Uniform causal attention's entropy, mean over ``n`` query positions: ``mean_i log(i + 1)`` (nats)."""
    return math.lgamma(n + 1) / n


@torch.no_grad()
def teacher_attention_entropy(
    model: GPT, data: TokenData, config: LinearizeAttentionConfig, device: torch.device
) -> list[float]:
    """Per block, the teacher's mean attention entropy (nats) on ``entropy_batches`` validation batches.

    The mean over heads, sequences and query positions of `causal_attention_entropy` of each block's
    ``q, k`` (its ``qkv`` projection of the block's attention input, split into heads as the attention
    does), on the evaluation's first batches (``batch_size x context`` tokens each).
    """
    model.eval()
    blocks = list(model.transformer.h)
    totals = [0.0] * len(blocks)

    def record(index: int) -> Callable[..., None]:
        def hook(attention: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            x = args[0]
            b, n, _ = x.shape
            heads, head_dim = attention.num_heads, attention.head_dim
            q, k, _ = attention.qkv(x).view(b, n, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
            totals[index] += causal_attention_entropy(q, k).mean().item()

        return hook

    handles = [block.attn.register_forward_pre_hook(record(i)) for i, block in enumerate(blocks)]
    try:
        for batch in range(config.entropy_batches):
            x, _ = data.batch(
                "val", config.batch_size, config.context, seed=(EVAL_SEED, batch), device=device
            )
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return [total / config.entropy_batches for total in totals]


def with_context(model: GPT, block_size: int) -> GPT:
    """``model``'s architecture at context ``block_size``, for timing only.

    The weights are copied, the learned positions as far as both contexts go: past the trained ones
    they stay at their initialization (a model of longer context than it was trained at computes
    nothing meaningful there, but takes the same time per token, which is all it is used for).
    """
    if block_size == model.config.block_size:
        return model
    resized = GPT(dataclasses.replace(model.config, block_size=block_size)).to(model.lm_head.weight.device)
    state = model.state_dict()
    positions = resized.transformer.wpe.weight.detach().clone()
    kept = min(block_size, model.config.block_size)
    positions[:kept] = state["transformer.wpe.weight"][:kept]
    resized.load_state_dict({**state, "transformer.wpe.weight": positions})
    return resized


@torch.no_grad()
def decode_ms(
    model: GPT, data: TokenData, context: int, new_tokens: int, seed: int, device: torch.device
) -> float:
    """Milliseconds per generated token of ``model.stream`` at ``context``, one thread.

    The prompt is ``context - new_tokens - 1`` validation tokens; the prefill and one step are untimed,
    then ``new_tokens`` steps are timed, the last at the context's last position: the RF attention's
    O(1) state (with a window: and its ring of the last keys and values) against softmax's KV cache
    of the whole context.
    """
    model.eval()
    prompt, _ = data.batch("val", 1, context - new_tokens - 1, seed=(seed, 0), device=device)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tokens = model.stream(
            prompt, new_tokens + 2, generator=torch.Generator(device=device).manual_seed(seed)
        )
        next(tokens), next(tokens)
        start = time.perf_counter()
        for _ in tokens:
            pass
        elapsed = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    return 1000 * elapsed / new_tokens


# ------------------------------------------------------------------------------------------ report
def gap_closed(swap: float, teacher: float, value: float) -> float:
    """``100 (swap - value) / (swap - teacher)``: the share of the swap-to-teacher loss gap closed, in %."""
    return 100 * (swap - value) / (swap - teacher)


def over_seeds(values: Sequence[float]) -> dict[str, Any]:
    """``values`` (one per seed) with their mean, least, largest and spread (largest - least)."""
    return {
        "mean": sum(values) / len(values),
        "min": min(values),
        "max": max(values),
        "spread": max(values) - min(values),
        "seeds": list(values),
    }


def summarize_row(
    row: Row,
    seeds: Sequence[int],
    records: dict[tuple[int, str], dict[str, Any]],
    swap: dict[int, float],
    teacher_loss: float,
    refusal: str | None,
) -> dict[str, Any]:
    """The report's record of ``row`` from its runs' ``records`` by ``(seed, variant)`` and swap losses.

    Per variant the validation loss and gap closed over seeds (`over_seeds`); ``transfer_minus_swap``:
    the mean of transfer + FT's loss less that of swap + FT, and the run-to-run spread it is to be read
    against, the larger of the two variants' spreads; ``mse_cut``: per layer the transfer's MSE cut
    (%), mean over seeds. A refused transfer leaves its entries out and says why in ``refused``.
    """
    trained = [v for v in TRAINED if not (v == "transfer_finetune" and refusal)]
    loss = {"swap": over_seeds([swap[s] for s in seeds])}
    closed = {}
    for v in trained:
        values = [records[(s, v)]["metrics"]["val_loss"] for s in seeds]
        loss[v] = over_seeds(values)
        closed[v] = over_seeds(
            [gap_closed(swap[s], teacher_loss, x) for s, x in zip(seeds, values, strict=True)]
        )
    summary: dict[str, Any] = {
        "attention": row[0],
        "window": row[1],
        "seeds": list(seeds),
        "teacher_val_loss": teacher_loss,
        "val_loss": loss,
        "gap_closed": closed,
        "steps": {
            v: {
                "transfer": records[(seeds[0], v)]["details"]["transfer"].get("steps", 0),
                "finetune": records[(seeds[0], v)]["steps"],
            }
            for v in trained
        },
    }
    if refusal:
        return summary | {"refused": {"transfer_finetune": refusal}}
    transfers = [records[(s, "transfer_finetune")]["details"]["transfer"] for s in seeds]
    cuts = [
        [100 * (1 - a / b) for b, a in zip(t["mse_before"], t["mse_after"], strict=True)] for t in transfers
    ]
    return summary | {
        "transfer_minus_swap": {
            "mean": loss["transfer_finetune"]["mean"] - loss["swap_finetune"]["mean"],
            "spread": max(loss["transfer_finetune"]["spread"], loss["swap_finetune"]["spread"]),
        },
        "mse_before": [t["mse_before"] for t in transfers],
        "mse_after": [t["mse_after"] for t in transfers],
        "mse_cut": [sum(layer) / len(layer) for layer in zip(*cuts, strict=True)],
    }


def _percent(stats: dict[str, Any]) -> str:
    """``97.1% (0.4)``: a mean share and its spread over seeds."""
    return f"{stats['mean']:.1f}% ({stats['spread']:.1f})"


def table(
    summaries: list[dict[str, Any]], contexts: Sequence[int], teacher_ms: dict[str, float] | None
) -> tuple[list[str], list[list[str]]]:
    """The header and one row per summary: losses, gaps closed, the difference, MSE cuts, decode ms."""
    timed = teacher_ms is not None
    header = [
        "attention",
        "window",
        "swap",
        "swap + FT",
        "transfer + FT",
        "gap closed: swap + FT (spread)",
        "gap closed: transfer + FT (spread)",
        "transfer + FT - swap + FT (spread)",
        "transfer MSE cut per layer",
        *(f"ms/token at {c}" + (f" (teacher {teacher_ms[str(c)]:.2f})" if timed else "") for c in contexts),
    ]
    rows = []
    for r in summaries:
        loss, closed = r["val_loss"], r["gap_closed"]
        refused = "refused" if r.get("refused") else None
        difference = r.get("transfer_minus_swap")
        rows.append(
            [
                r["attention"],
                str(r["window"]),
                f"{loss['swap']['mean']:.4f}",
                f"{loss['swap_finetune']['mean']:.4f}",
                refused or f"{loss['transfer_finetune']['mean']:.4f}",
                _percent(closed["swap_finetune"]),
                refused or _percent(closed["transfer_finetune"]),
                refused or f"{difference['mean']:+.4f} ({difference['spread']:.4f})",
                refused or " / ".join(f"{cut:.0f}%" for cut in r["mse_cut"]),
                *(f"{r['decode_ms'][str(c)]:.2f}" if timed else "-" for c in contexts),
            ]
        )
    return header, rows


def caption(
    config: LinearizeAttentionConfig,
    teacher: dict[str, Any],
    summaries: list[dict[str, Any]],
    missing: list[Row],
    timed: bool,
) -> str:
    """The text under the table: the teacher, what the columns mean, refusals, missing rows."""
    entropy = " / ".join(f"{h:.2f}" for h in teacher["entropy"])
    lines = [
        f"Teacher (softmax): validation loss {teacher['val_loss']:.4f}; mean attention entropy per layer "
        f"{entropy} nats (uniform causal attention over {config.context} positions: "
        f"{teacher['uniform_entropy']:.2f} nats).",
        *(
            [
                f"The teacher fine-tuned like swap + FT (softmax, {config.steps} steps, the same seeds): "
                f"validation loss {teacher['finetuned_val_loss']['mean']:.4f} (spread "
                f"{teacher['finetuned_val_loss']['spread']:.4f}); the gap closed is measured against the "
                "teacher before it."
            ]
            if "finetuned_val_loss" in teacher
            else []
        ),
        f"Validation losses are means over seeds {', '.join(map(str, config.seeds))}; the spread is max - "
        "min over the seeds, that of transfer + FT - swap + FT the larger of the two variants' spreads "
        "(transfer + FT beats swap + FT by more than the run-to-run spread where the difference is below "
        "minus its spread). Gap closed: (swap - x) / (swap - teacher). Transfer MSE cut: per layer, "
        "1 - after / before on the transfer's first batch, mean over seeds. "
        f"{config.steps} steps per trained variant, {config.transfer_steps} of them transfer in "
        "transfer + FT.",
    ]
    if timed:
        lines.append(
            f"ms/token: {config.new_tokens} decoded tokens ending at the context's last position, one "
            "thread, the converted model's feature state (and window ring) against the teacher's KV cache; "
            f"at contexts past the teacher's {config.context} the same architecture with more learned "
            "positions (those past the trained ones at their initialization: the time does not depend "
            "on the weights)."
        )
    else:
        lines.append(
            "ms/token: timed once every row has finished, or by a call that trains nothing (run the command "
            "again once every shard is done), so that no run of the grid competes for the CPU."
        )
    lines += [
        f"{r['attention']} window {r['window']}: transfer refused: {r['refused']['transfer_finetune']}"
        for r in summaries
        if r.get("refused")
    ]
    if missing:
        lines.append("Not finished yet: " + ", ".join(f"{a} window {w}" for a, w in missing) + ".")
    return "\n\n".join(lines)


def plot_gap_closed(summaries: list[dict[str, Any]], path: Path) -> Path:
    """Gap closed per row, swap + FT and transfer + FT side by side, error bars from least to largest seed."""
    plt = pyplot()

    figure, ax = plt.subplots(figsize=(max(6.0, 0.7 * len(summaries) + 2), 4.2))
    width = 0.38
    bars = (
        ("swap_finetune", "swap + FT", -width / 2, "C0"),
        ("transfer_finetune", "transfer + FT", width / 2, "C1"),
    )
    for variant, label, offset, color in bars:
        labelled = False
        for x, summary in enumerate(summaries):
            stats = summary["gap_closed"].get(variant)
            if stats is None:
                ax.text(x + offset, 0, "refused", rotation=90, ha="center", va="bottom", fontsize=7)
                continue
            error = [[stats["mean"] - stats["min"]], [stats["max"] - stats["mean"]]]
            ax.bar(
                x + offset,
                stats["mean"],
                width,
                yerr=error,
                capsize=3,
                color=color,
                label=None if labelled else label,
            )
            labelled = True
    ax.axhline(100, color="k", lw=0.8, ls="--")
    ax.set_xticks(
        range(len(summaries)), [f"{s['attention']}\nw={s['window']}" for s in summaries], fontsize=7
    )
    ax.set_ylabel("swap-to-teacher gap closed (%)")
    ax.set_title("Gap closed per row (bars: mean over seeds, lines: their range)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(figure, path, dpi=120)


def _swap_loss(run: TrainConfig, data: TokenData, device: torch.device) -> float:
    """The validation loss of ``run``'s model before any training: the teacher with its attention swapped."""
    return evaluate(build_model(run, data, device), data, run, Distributed(device=device))


def _decode_ms(
    model: GPT | Callable[[], GPT],
    data: TokenData,
    config: LinearizeAttentionConfig,
    context: int,
    device: torch.device,
) -> float:
    """`decode_ms` of ``model`` (or of the model a function builds) at ``context`` (`with_context`)."""
    model = model if isinstance(model, GPT) else model()
    return decode_ms(with_context(model, context), data, context, config.new_tokens, config.seed, device)


def linearize_attention(config: LinearizeAttentionConfig) -> str:
    """Run this shard's variants (finished runs reused) and report the rows whose runs are all finished.

    Returns the Markdown table and its caption (also ``out/linearize-attention.md``, with the ``.csv``, the
    summaries in ``out/linearize-attention.jsonl`` and the plot in ``out/linearize-attention.png`` or
    ``--plot``).
    """
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    if config.threads:
        torch.set_num_threads(config.threads)
    data, teacher = prepare_teacher(config)
    refused = {row: transfer_refusal(*row) for row in config.rows}
    runs = variant_runs(config, data, teacher, refused)
    references = {seed: teacher_finetune_run(config, seed, data, teacher) for seed in config.seeds}
    outcome = run_grid(
        [*references.values(), *runs.values()],
        train,
        place=_place,
        grid=config,
        resume=config.resume,
        desc="linearize-attention",
    )
    finished = {cell: finished_record(*_place(run)) for cell, run in runs.items()}
    device = resolve_device(config.device)
    tokens = TokenData(data)
    cache = out / MEASURED
    teacher_model = GPT.from_pretrained(teacher, block_size=config.context).to(device)
    reference = config.variant(config.rows[0], config.seeds[0], "swap_finetune", data, teacher)
    settings = f"{teacher} data={data} context={config.context} batch={config.batch_size}"

    def measure_teacher() -> dict[str, Any]:
        return {
            "val_loss": evaluate(teacher_model, tokens, reference, Distributed(device=device)),
            "entropy": teacher_attention_entropy(teacher_model, tokens, config, device),
            "uniform_entropy": uniform_causal_entropy(config.context),
        }

    teacher_summary = measured(
        cache,
        f"teacher {settings} eval_batches={config.eval_batches} entropy_batches={config.entropy_batches}",
        measure_teacher,
    )
    finetuned = [finished_record(*_place(run)) for run in references.values()]
    if all(record is not None for record in finetuned):
        teacher_summary["finetuned_val_loss"] = over_seeds(
            [record["metrics"]["val_loss"] for record in finetuned]  # type: ignore[index]
        )
    summaries, missing = [], []
    for row in config.rows:
        cells = [(s, v) for s in config.seeds for v in TRAINED if (*row, s, v) in runs]
        records = {cell: record for cell in cells if (record := finished[(*row, *cell)]) is not None}
        if len(records) < len(cells):
            print(
                f"{row[0]} window {row[1]}: not every run has finished (another shard's, or failed): left out"
            )
            missing.append(row)
            continue
        swap = {}
        for s in config.seeds:
            swap_run = config.variant(row, s, "swap_finetune", data, teacher)
            swap[s] = measured(
                cache,
                f"swap val_loss {run_name(swap_run)}",
                functools.partial(_swap_loss, swap_run, tokens, device),
            )
        summaries.append(
            summarize_row(row, config.seeds, records, swap, teacher_summary["val_loss"], refused[row])
        )
    teacher_ms = None
    if not missing or not (outcome.ran or outcome.failed):  # no run of the grid competes for the CPU
        teacher_ms = {
            str(c): measured(
                cache,
                f"decode ms/token softmax {settings} context={c} new_tokens={config.new_tokens}",
                functools.partial(_decode_ms, teacher_model, tokens, config, c, device),
            )
            for c in config.decode_contexts
        }
        for summary in summaries:
            row = (summary["attention"], summary["window"])
            run = config.variant(row, config.seeds[0], "swap_finetune", data, teacher)
            summary["decode_ms"] = {
                str(c): measured(
                    cache,
                    f"decode ms/token {row[0]} window={row[1]} features={config.attention_features} "
                    f"{settings} context={c} new_tokens={config.new_tokens}",
                    functools.partial(
                        _decode_ms,
                        functools.partial(build_model, run, tokens, device),
                        tokens,
                        config,
                        c,
                        device,
                    ),
                )
                for c in config.decode_contexts
            } | {"teacher": teacher_ms}
    (out / RESULTS).write_text("", encoding="utf-8")
    for summary in summaries:
        append_jsonl(out / RESULTS, summary | {"teacher": teacher_summary})
    text = write_table(out / TABLE, *table(summaries, config.decode_contexts, teacher_ms))
    notes = caption(config, teacher_summary, summaries, missing, teacher_ms is not None)
    (out / TABLE).with_suffix(".md").write_text(f"{text}\n\n{notes}\n", encoding="utf-8")
    if summaries:
        plot_gap_closed(summaries, config.plot if config.plot is not None else out / PLOT)
    return f"{text}\n\n{notes}\n"
