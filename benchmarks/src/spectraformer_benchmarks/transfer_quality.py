"""Attention transfer on a peaked teacher: each layer's MSE and the logits' error, before and after.

The teacher is a tiny Llama built from a config with random weights (2 layers, width 128, 4 heads of 32,
vocabulary 64, context 64) whose query and key projections are scaled by 8: peaked attention, as trained
models have. Each row converts a copy with ``rf_attention.hf.linearize`` (seed 0), runs
``attention_transfer`` for ``--steps`` steps on fresh batches of random tokens (``--batch`` x 64, one new
batch per step), and measures on a held-out batch of the same kind: each layer's attention-output MSE
against softmax under teacher forcing, and the MSE of the final logits against the teacher's (the error
that compounds through the layers). A cut is ``1 - after / before``.

    uv run --frozen --package spectraformer-benchmarks python -m spectraformer_benchmarks.transfer_quality

The rows: the library's defaults (``linearize``'s per-head input maps, ``attention_transfer``'s peak lr,
cosine schedule with warmup), the earlier defaults (no input maps, constant lr 1e-2), the defaults without
input maps, the defaults plus the attention-weight divergence (Hedgehog's loss), the learned-map
baselines ``hedgehog`` and ``t2r`` with the defaults, at the same feature width as the random pair
(``--features`` columns), and the sliding-window hybrid (``linearize``'s ``window=8``: the last 8
positions by exact softmax weights) of ``posrf-orf`` and of ``hedgehog`` (with LoLCATs' learned factor).
The last column divides each error after transfer by that of the first row printed (the defaults), per
layer and for the logits. ``--lr`` sets every row's peak lr (the guide's learning-rate table:
``--row "posrf-orf, defaults" --lr 1e-2``), ``--row`` picks rows by label.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

import rf_attention.hf
from rf_attention.transfer import attention_transfer, teacher_forced
from spectraformer_benchmarks.common import command_line, machine

VOCAB, WIDTH, LAYERS, HEADS, CONTEXT = 64, 128, 2, 4, 64
#: Factor of the teacher's query and key projection weights.
PEAK = 8.0


@dataclass(frozen=True)
class Row:
    """One conversion: the attention name, ``linearize`` and ``attention_transfer`` options."""

    label: str
    name: str
    rows_of_w: Callable[[int], int]  # the feature width -> linearize's num_features (rows of W)
    linearize: dict[str, Any] = field(default_factory=dict)
    transfer: dict[str, Any] = field(default_factory=dict)


ROWS = [
    Row("posrf-orf, defaults", "posrf-orf", lambda width: width),
    Row(
        "posrf-orf, earlier defaults (no input maps, constant lr 1e-2)",
        "posrf-orf",
        lambda width: width,
        {"input_map": False},
        {"lr": 1e-2, "schedule": "constant", "warmup": 0.0},
    ),
    Row("posrf-orf, defaults without input maps", "posrf-orf", lambda width: width, {"input_map": False}),
    Row(
        "posrf-orf, defaults + attention-weight divergence 1e-2",
        "posrf-orf",
        lambda width: width,
        transfer={"attention_weight": 1e-2},
    ),
    Row("hedgehog, defaults", "hedgehog", lambda width: width // 2),  # [softmax(xW), softmax(-xW)]: 2 s
    Row("t2r, defaults", "t2r", lambda width: width),
    Row("posrf-orf, defaults, window 8", "posrf-orf", lambda width: width, {"window": 8}),
    Row("hedgehog, defaults, window 8", "hedgehog", lambda width: width // 2, {"window": 8}),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--help`` lists them)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="transfer steps")
    parser.add_argument("--batch", type=int, default=16, help="sequences per transfer batch")
    parser.add_argument("--features", type=int, default=32, help="feature width per head")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--lr", type=float, default=None, help="peak transfer lr of every row (default: each row's own)"
    )
    parser.add_argument(
        "--row", action="append", default=None, help="only the row with this label (repeatable; default: all)"
    )
    return parser.parse_args(argv)


def peaked_llama() -> torch.nn.Module:
    """The teacher: a random tiny Llama (seed 0) with its query and key projections scaled by `PEAK`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=CONTEXT,
    )
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(PEAK)
            layer.self_attn.k_proj.weight.mul_(PEAK)
    return model


def errors(
    model: torch.nn.Module, ids: torch.Tensor, teacher_logits: torch.Tensor
) -> tuple[list[float], float]:
    """Each layer's MSE against softmax (teacher forcing) and the logits' MSE against the teacher's."""
    with torch.no_grad():
        logits = model(ids, use_cache=False).logits
        with teacher_forced(model) as losses:
            model(ids, use_cache=False)
    return list(losses.floats()), float((logits - teacher_logits).pow(2).mean())


def converted(teacher: torch.nn.Module, row: Row, features: int) -> torch.nn.Module:
    """A copy of ``teacher`` linearized as ``row`` says (seed 0), ``features`` columns per head."""
    model = copy.deepcopy(teacher)
    return rf_attention.hf.linearize(
        model, row.name, num_features=row.rows_of_w(features), seed=0, **row.linearize
    )


def measure(row: Row, args: argparse.Namespace) -> dict[str, Any]:
    """One row: the cuts of each layer's MSE and of the logits' MSE on the held-out batch."""
    teacher = peaked_llama()
    generator = torch.Generator().manual_seed(0)
    held_out = torch.randint(0, VOCAB, (args.batch, CONTEXT), generator=generator)
    batches = [torch.randint(0, VOCAB, (args.batch, CONTEXT), generator=generator) for _ in range(args.steps)]
    with torch.no_grad():
        teacher_logits = teacher(held_out).logits
    model = converted(teacher, row, args.features)
    layers_before, logits_before = errors(model, held_out, teacher_logits)
    start = time.perf_counter()
    options = row.transfer | ({"lr": args.lr} if args.lr is not None else {})
    report = attention_transfer(model, batches, steps=args.steps, **options)
    seconds = time.perf_counter() - start
    layers_after, logits_after = errors(model, held_out, teacher_logits)
    return {
        "layers": [(b, a) for b, a in zip(layers_before, layers_after, strict=True)],
        "logits": (logits_before, logits_after),
        "skipped": report.skipped_steps,
        "seconds": seconds,
    }


def cut(before: float, after: float) -> str:
    """``1 - after / before`` as a percentage."""
    return f"{1 - after / before:.0%}"


def after_transfer(result: dict[str, Any]) -> list[float]:
    """Each layer's MSE and the logits' MSE after transfer, in that order."""
    return [after for _, after in [*result["layers"], result["logits"]]]


def main(argv: list[str] | None = None) -> None:
    """Print the table (Markdown) and the command and machine that made it."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    lines = [
        "| conversion | MSE cut per layer (before -> after) | logits MSE cut (before -> after) | skipped "
        "| after / defaults' after (per layer / logits) |",
        "|---|---|---|---|---|",
    ]
    reference: list[float] = []
    rows = [row for row in ROWS if args.row is None or row.label in args.row]
    if not rows:
        raise SystemExit(f"--row: expected labels among {[row.label for row in ROWS]}, got {args.row}")
    for row in rows:
        result = measure(row, args)
        layers = " / ".join(f"{cut(b, a)} ({b:.4f} -> {a:.4f})" for b, a in result["layers"])
        before, after = result["logits"]
        logits = f"{cut(before, after)} ({before:.4f} -> {after:.4f})"
        reference = reference or after_transfer(result)
        ratios = " / ".join(f"{a / r:.2f}" for a, r in zip(after_transfer(result), reference, strict=True))
        lines.append(f"| {row.label} | {layers} | {logits} | {result['skipped']} | {ratios} |")
        print(lines[-1], flush=True)
    print()
    print("\n".join(lines))
    print(f"\n{command_line()}\n{machine()}")


if __name__ == "__main__":
    main()
