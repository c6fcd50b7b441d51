"""Decoding: per-token latency and state memory of causal attention against the context length.

For each attention and context length ``L``, a causal module (``eval()``, float32, batch 1) is given the
state of an ``L``-token context, then ``--tokens`` single-token ``step`` calls are timed (median, after
``--warmup`` steps; ``--rounds`` times from the same state, the fastest median kept: the machine may be
shared). RF attention's state comes from ``prefill`` of the ``L`` tokens (O(L)); softmax's KV
cache is filled with the context's projected keys and values, which is what its ``prefill`` stores, without
running its O(L^2) causal forward pass (the per-token cost depends only on what the cache holds). The
cache is allocated for ``L + warmup + tokens`` positions so that no timed step grows it. Memory is the
bytes the state holds: ``m x Dv`` sums for RF attention (the same at every ``L``), ``2 L dim`` floats for
the cache.

    uv run --frozen --package spectraformer-benchmarks python -m spectraformer_benchmarks.decoding \
        --plot docs/img/decoding.png

``--generate`` times plain ``model.generate()`` of a tiny Llama built from a config (2 layers, width 256,
4 heads, 2 KV heads, vocabulary 1024, float32, batch 1, greedy) after a random prompt of each length: the
time between consecutive calls of a logits processor (one call per new token) is the time of one token,
the median of ``--tokens`` of them is reported. Columns: ``rf`` (``attn_implementation="rf-performer"``
after ``rf_attention.hf.attach_feature_maps``: the recurrent state per layer), ``rf, key cache`` (the same
model given HF's ``DynamicCache``, which keeps the keys: each token re-reads the prefix; only up to
``--key-cache-max``) and ``sdpa``, all in the same run:

    uv run --frozen --package spectraformer-benchmarks python -m spectraformer_benchmarks.decoding \
        --generate --rounds 3 --tokens 8 --contexts 4096 32768
"""

from __future__ import annotations

import argparse
import copy
import itertools
import statistics
import time
from pathlib import Path

import torch

import rf_attention
from app_common.plots import pyplot, save_figure
from rf_attention.decoding import KVCache
from spectraformer_benchmarks.common import command_line, machine

DEFAULT_CONTEXTS = [1024, 4096, 16384, 65536]
DEFAULT_ATTENTIONS = ["softmax", "performer", "oprf-fastfoodl"]


GENERATE_CONTEXTS = [256, 1024, 4096, 16384, 32768]
#: The goals of ``--generate``: sdpa's time per token over rf-performer's at least this, at these prompts.
GENERATE_GOALS = {4096: 1.0, 32768: 3.0}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--help`` lists them)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=DEFAULT_CONTEXTS)
    parser.add_argument("--attentions", nargs="+", default=DEFAULT_ATTENTIONS)
    parser.add_argument("--dim", type=int, default=256, help="model width")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--features", type=int, default=128, help="random features m")
    parser.add_argument("--tokens", type=int, default=20, help="timed steps per point")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3, help="repeats per point; the fastest median is kept")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG here")
    parser.add_argument("--generate", action="store_true", help="time HF model.generate() instead")
    parser.add_argument("--key-cache-max", type=int, default=4096, help="longest prompt for 'rf, key cache'")
    return parser.parse_args(argv)


def context_state(module: rf_attention.MultiheadSelfAttention, x: torch.Tensor, capacity: int):
    """The decoding state after the context ``x (1, L, dim)`` (see the module docstring)."""
    if not isinstance(module, rf_attention.SoftmaxAttention):
        return module.prefill(x)[1]
    b, n, _ = x.shape
    _, k, v = module.qkv(x).view(b, n, 3, module.num_heads, module.head_dim).permute(2, 0, 3, 1, 4)
    return KVCache.empty(k, v, capacity=capacity).append(k, v)


@torch.no_grad()
def measure_point(name: str, context: int, args: argparse.Namespace) -> dict:
    """Median seconds per ``step`` and state bytes of ``name`` after ``context`` tokens."""
    module = rf_attention.create(name, args.dim, args.heads, num_features=args.features, causal=True, seed=0)
    module.eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, context, args.dim, generator=g)
    state = context_state(module, x, context + args.warmup + args.tokens)
    tokens = torch.randn(args.warmup + args.tokens, 1, 1, args.dim, generator=g)
    medians = []
    for _ in range(args.rounds):  # each round continues the same context by the same tokens
        times, current = [], copy.deepcopy(state)
        for i, token in enumerate(tokens):
            start = time.perf_counter()
            _, current = module.step(token, current)
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
        medians.append(statistics.median(times))
    return {"attention": name, "context": context, "seconds": min(medians), "bytes": current.nbytes()}


def table(results: list[dict], attentions: list[str]) -> str:
    """Markdown: ms per token and state memory per context, and the speed-up over softmax."""
    rf = [a for a in attentions if a != "softmax"]
    by = {(r["attention"], r["context"]): r for r in results}
    header = ["context", *(f"{a} ms/token" for a in attentions)]
    header += [f"{a} speed-up" for a in rf if "softmax" in attentions]
    header += [f"{a} state" for a in attentions]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for context in sorted({r["context"] for r in results}):
        row = [f"{context:,}"]
        row += [f"{by[(a, context)]['seconds'] * 1e3:.3f}" for a in attentions]
        if "softmax" in attentions:
            soft = by[("softmax", context)]["seconds"]
            row += [f"{soft / by[(a, context)]['seconds']:.1f}x" for a in rf]
        row += [_size(by[(a, context)]["bytes"]) for a in attentions]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.0f} KiB"


def plot(results: list[dict], attentions: list[str], path: Path, title: str) -> None:
    """Per-token latency and state memory against the context, log-log."""
    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in attentions:
        points = sorted((r["context"], r["seconds"], r["bytes"]) for r in results if r["attention"] == name)
        contexts = [p[0] for p in points]
        axes[0].plot(contexts, [p[1] * 1e3 for p in points], marker="o", label=name)
        axes[1].plot(contexts, [p[2] / 2**20 for p in points], marker="o", label=name)
    for ax, label in zip(axes, ("ms per token (median)", "state memory (MiB)"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path, dpi=120)


def tiny_llama(attn_implementation: str, max_positions: int):
    """The benchmark's Llama (2 layers, width 256, 4 heads, 2 KV heads), seeded, ``eval()``."""
    import transformers

    import rf_attention.hf  # registers the rf-* attention names

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
    )
    config._attn_implementation = attn_implementation
    model = transformers.LlamaForCausalLM(config).eval()
    if attn_implementation.startswith("rf-"):
        rf_attention.hf.attach_feature_maps(model)
    return model


@torch.no_grad()
def generate_point(model, context: int, key_cache: bool, args: argparse.Namespace) -> float:
    """Median seconds per new token of one ``model.generate()`` after a random ``context``-token prompt."""
    import transformers

    stamps: list[float] = []

    def stamp(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        stamps.append(time.perf_counter())
        return scores

    prompt = torch.randint(1, 1024, (1, context), generator=torch.Generator().manual_seed(context))
    extra = {"cache": transformers.DynamicCache(config=model.config)} if key_cache else {}
    model.generate(
        input_ids=prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=args.warmup + args.tokens + 1,
        min_new_tokens=args.warmup + args.tokens + 1,
        do_sample=False,
        pad_token_id=0,
        logits_processor=transformers.LogitsProcessorList([stamp]),
        **extra,
    )
    return statistics.median([b - a for a, b in itertools.pairwise(stamps)][args.warmup :])


def generate_main(args: argparse.Namespace) -> None:
    """The ``--generate`` table: ms per new token of rf-performer (state / key cache) and sdpa.

    Each round measures every point once, contexts in turn; the fastest round is kept per point, so that a
    burst of load on a shared machine slows one round of a point, not a whole column.
    """
    contexts = args.contexts if args.contexts != DEFAULT_CONTEXTS else GENERATE_CONTEXTS
    longest = max(contexts) + args.warmup + args.tokens + 2
    models = {"rf": tiny_llama("rf-performer", longest), "sdpa": tiny_llama("sdpa", longest)}
    columns = [("rf", "rf", False), ("rf, key cache", "rf", True), ("sdpa", "sdpa", False)]
    best: dict[tuple[int, str], float] = {}
    for round_ in range(args.rounds):
        for context in contexts:
            for column, model, key_cache in columns:
                if key_cache and context > args.key_cache_max:
                    continue
                seconds = generate_point(models[model], context, key_cache, args)
                best[(context, column)] = min(seconds, best.get((context, column), seconds))
                print(f"round {round_}, {context}, {column}: {seconds * 1e3:.2f} ms", flush=True)
    print(f"\n{machine()}\nLlama: 2 layers, width 256, 4 heads, 2 KV heads, float32, batch 1, greedy")
    print(f"Command: `{command_line()}`\n")
    first = contexts[0]
    print(f"| prompt | rf-performer | rf-performer, key cache | sdpa | sdpa / rf | rf / rf at {first:,} |")
    print("|---|---|---|---|---|---|")
    for context in contexts:
        rf, sdpa = best[(context, "rf")], best[(context, "sdpa")]
        key = best.get((context, "rf, key cache"))
        print(
            f"| {context:,} | {rf * 1e3:.2f} | {'-' if key is None else f'{key * 1e3:.2f}'} | "
            f"{sdpa * 1e3:.2f} | {sdpa / rf:.1f}x | {rf / best[(first, 'rf')]:.2f}x |"
        )
    print()
    for context, bound in GENERATE_GOALS.items():
        if context in contexts:
            ratio = best[(context, "sdpa")] / best[(context, "rf")]
            verdict = "met" if ratio >= bound else "MISSED"
            print(f"- goal sdpa / rf >= {bound}x at a {context:,}-token prompt: {ratio:.2f}x, {verdict}")


def main(argv: list[str] | None = None) -> None:
    """Measure every (attention, context) point, print the table, optionally plot."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.generate:
        generate_main(args)
        return
    results = []
    for context in args.contexts:
        for name in args.attentions:
            results.append(measure_point(name, context, args))
            print(f"{name:>16} L={context:>6}: {results[-1]['seconds'] * 1e3:.3f} ms/token", flush=True)
    width = f"dim {args.dim}, {args.heads} heads, m = {args.features}, batch 1, float32"
    print(f"\n{machine()}\n{width}\n")
    print(table(results, args.attentions))
    if args.plot:
        plot(results, args.attentions, args.plot, f"decoding, {width}; {machine()}")


if __name__ == "__main__":
    main()
