"""Attention scaling: forward+backward time and peak memory against the sequence length.

Each attention runs in fresh processes (``--isolation point``: one per attention and N) that build
``q, k, v`` of shape ``(B, H, N, Dh)`` (float32, ``requires_grad``) and run one forward+backward at N = 256
first (code pages and allocator pools touched on first use are not the attention's memory). One process
measures, for each N in increasing order, the peak memory one forward+backward adds (CPU: the resident
high-water mark ``VmHWM``, reset through ``/proc/self/clear_refs`` just before, minus the resident size
``VmRSS`` then, with glibc's mmap threshold fixed so that it counts live tensors and a freed tensor's pages
go back at once; CUDA: ``torch.cuda.max_memory_allocated`` minus the allocated bytes before); another, with
the allocator as users run it, times ``1 + --repeats`` runs (median; ``--repeats-at N=R`` sets another
count at one length). Every number is reported next to
``softmax`` (``scaled_dot_product_attention``) measured in the same run, with the achieved GFLOP/s (from an
analytic FLOP count) next to the machine's measured float32 matmul rate, and checked against the goals in
``GOALS``.

``--compile`` measures instead one training step of the whole module (``create(name, ...)``, forward and
backward of ``(B, N, H * Dh)``) eager and under ``torch.compile(module, fullgraph=True)`` (inductor),
interleaved, after the compiled module's first two calls (compilation; a recompilation raises).

    uv run --frozen nox -s bench                          # every benchmark at its defaults
    python -m spectraformer_benchmarks.attention_scaling --lengths 1024 2048 --attentions softmax performer
    python -m spectraformer_benchmarks.attention_scaling --threads 1 --isolation run \
        --attentions softmax pairs --lengths 1024 8192 16384 \
        --repeats 4 --repeats-at 8192=2 --repeats-at 16384=1 \
        --operations results/bench/operation_counts.json --summary results/bench/attention_scaling.md \
        --plot docs/img/attention_scaling.png                 # the Performance page's run
    python -m spectraformer_benchmarks.attention_scaling --threads 1 --compile --lengths 2048 \
        --attentions trigrf-sorf posrf-orf posrf-hyp-orf gerf-orf oprf-fastfoodl saderf-orf
    python -m spectraformer_benchmarks.attention_scaling --device cuda --lengths 4096 65536   # on a GPU

(each ``python -m`` as ``uv run --frozen --package spectraformer-benchmarks python -m ...``)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import rf_attention
from app_common.measure import PeakMemoryMeter, Timer, interleaved_medians
from app_common.plots import pyplot, save_figure
from spectraformer_benchmarks.common import (
    QUANTITIES,
    add_repeats_arguments,
    expand_pairs,
    k,
    machine,
    matmul_rate,
    repeats_at,
    rf_pairs,
    run_json_lines,
)

DEFAULT_ATTENTIONS = [
    "softmax",
    "performer",
    "performer-pytorch",
    "posrf-fastfoodl",
    "oprf-fastfoodl",
    "oprf-qmc",
    "saderf-orf",
    "trigrf-sorf",
    "oprf-sgq",
    "nystromformer",
    "skyformer",
    "linformer",
    "bigbird",
    "reformer",
    "informer",
]
#: In ``--attentions``, stands for every ``"<component>-<matrix>"`` pair of ``rf_attention.names()``.
ALL_PAIRS = "pairs"


def baseline_options(name: str, n: int) -> dict:
    """Constructor options of the baselines at length ``n``: Table 1's settings.

    No Nystromformer convolution, as in the Skyformer LRA configuration; Linformer sized for exactly ``n``.
    """
    return {"nystromformer": {"conv_kernel_size": None}, "linformer": {"max_seq_len": n}}.get(name, {})


DEFAULT_LENGTHS = [1024, 2048, 4096, 8192, 16384]
#: Length of the forward+backward run before the measured ones (not counted).
WARMUP_LENGTH = 256


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--help`` lists them)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--attentions", nargs="+", default=DEFAULT_ATTENTIONS, help=f"names; {ALL_PAIRS!r}: every RF pair"
    )
    parser.add_argument("--lengths", type=int, nargs="+", default=DEFAULT_LENGTHS)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--features", type=int, default=128)
    add_repeats_arguments(parser, 5, "timed runs per point after the measured one (median of all)")
    parser.add_argument(
        "--isolation",
        choices=["point", "attention", "run"],
        default="attention",
        help="a fresh process per point, per attention (its lengths in increasing order), or one in all",
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds per point")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (CUDA peak: max_memory_allocated)")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="time a module training step eager and under torch.compile(fullgraph=True) instead",
    )
    parser.add_argument("--out", type=Path, default=Path("results/bench/attention_scaling.json"))
    parser.add_argument("--plot", type=Path, default=None, help="write PNGs of time and memory here")
    parser.add_argument("--summary", type=Path, default=None, help="write the per-attention table here")
    parser.add_argument(
        "--operations",
        type=Path,
        default=None,
        help="JSON of operation_counts.py --out: its counts (longest N) as a column of the summary",
    )
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="tables and plots of an earlier run's --out (no measuring)",
    )
    parser.add_argument("--points", nargs="+", metavar="ATTENTION:N", help=argparse.SUPPRESS)
    parser.add_argument("--quantity", choices=QUANTITIES, default="time", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.attentions = expand_pairs(args.attentions, ALL_PAIRS)
    return args


def build(name: str, n: int, args: argparse.Namespace):
    """``fn(q, k, v) -> out`` for an attention name at length ``n``, on ``(B, H, N, Dh)`` tensors."""
    if name == "performer-pytorch":
        from performer_pytorch import FastAttention

        module = FastAttention(dim_heads=args.head_dim, nb_features=args.features, causal=False)
        return module.to(args.device)
    module = build_module(name, n, args)
    return lambda q, k, v: module.attend(q, k, v, None)


def build_module(name: str, n: int, args: argparse.Namespace) -> torch.nn.Module:
    """``rf_attention.create(name, H * Dh, H, ...)`` at length ``n``, seeded, on the device."""
    return rf_attention.create(
        name,
        args.heads * args.head_dim,
        args.heads,
        num_features=args.features,
        seed=0,
        **baseline_options(name, n),
    ).to(args.device)


def feature_map_of(name: str):
    """The ``rf_features`` feature map an RF attention name builds (None for softmax and the baselines)."""
    if name == "performer-pytorch":  # its FastAttention computes FAVOR+, the features of our performer
        name = "performer"
    module = rf_attention.create(name, 8, 1, num_features=32, seed=0, **baseline_options(name, 64))
    return getattr(module, "feature_map", None)


def flops(name: str, n: int, args: argparse.Namespace) -> float:
    """Analytic forward+backward FLOPs (backward counted as twice the forward's matmuls)."""
    b, h, d, m = args.batch, args.heads, args.head_dim, args.features
    if name == "softmax":
        forward = 4 * b * h * n * n * d  # q k^T and p v
    elif (features := feature_map_of(name)) is not None:
        width = features.features_per_row * m
        forward = 4 * b * h * n * d * m + 4 * b * h * n * width * d  # projections; phi_k^T v and phi_q (kv)
    else:
        return float("nan")
    return 3.0 * forward


def measure_point(name: str, n: int, args: argparse.Namespace) -> dict:
    """``args.quantity`` of a forward+backward at ``n``: the peak memory of one, or the median time of some.

    Time: the median of ``1 + repeats_at(n)`` runs. Runs in a process that made one forward+backward at
    ``WARMUP_LENGTH`` first (`measure_points`).
    """
    torch.manual_seed(0)
    device = torch.device(args.device)
    attend = build(name, n, args)
    shape = (args.batch, args.heads, n, args.head_dim)
    q, k, v = (torch.randn(shape, device=device, requires_grad=True) for _ in range(3))
    if args.quantity == "memory":
        with PeakMemoryMeter(device) as meter:
            attend(q, k, v).sum().backward()
        return {"attention": name, "n": n, "peak_mib": meter.added / 2**20}
    samples = []
    for _ in range(1 + repeats_at(n, args)):
        for t in (q, k, v):
            t.grad = None
        with Timer(device) as timer:
            attend(q, k, v).sum().backward()
        samples.append(timer.elapsed)
    seconds = statistics.median(samples)
    return {
        "attention": name,
        "n": n,
        "seconds": seconds,
        "samples": len(samples),
        "gflops": flops(name, n, args) / seconds / 1e9,
    }


def measure_compile(name: str, n: int, args: argparse.Namespace) -> dict:
    """Median seconds of a module training step, eager and compiled (inductor, fullgraph), interleaved."""
    import copy

    torch._dynamo.reset()
    torch.manual_seed(0)
    device = torch.device(args.device)
    eager = build_module(name, n, args).train()
    compiled_module = copy.deepcopy(eager)
    compiled = torch.compile(compiled_module, fullgraph=True)
    x = torch.randn(args.batch, n, args.heads * args.head_dim, device=device)

    def step(module: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        return lambda: module(x).square().sum().backward()

    with torch._dynamo.config.patch(error_on_recompile=True):
        start = time.perf_counter()
        for _ in range(2):  # the first call compiles; the second must not recompile
            step(compiled)()
        compile_seconds = time.perf_counter() - start
        medians = interleaved_medians(
            {"eager": step(eager), "compiled": step(compiled)},
            repeats=repeats_at(n, args),
            device=device,
            setup=lambda: (eager.zero_grad(), compiled_module.zero_grad()),
        )
    return {
        "attention": name,
        "n": n,
        "eager_seconds": medians["eager"],
        "compiled_seconds": medians["compiled"],
        "compile_seconds": compile_seconds,
    }


#: Size of the matmul whose rate each attention's points are compared with (measured in their process, just
#: before them, so that the share of the matmul rate is one of the same load).
LOCAL_MATMUL_SIZE = 1024


def measure_points(points: list[tuple[str, int]], args: argparse.Namespace) -> None:
    """Run in a fresh process: a warm-up forward+backward per attention, then each point, printed as JSON."""
    device = torch.device(args.device)
    warmed: set[str] = set()
    for name, n in points:
        if args.compile:
            print(json.dumps(measure_compile(name, n, args)), flush=True)
            continue
        if name not in warmed:  # first use loads code pages and fills allocator pools
            warmed.add(name)
            warm = build(name, WARMUP_LENGTH, args)
            small = [
                torch.randn(args.batch, args.heads, WARMUP_LENGTH, args.head_dim, device=device)
                for _ in "qkv"
            ]
            warm(*(t.requires_grad_() for t in small)).sum().backward()
            if args.quantity == "time":
                rate = matmul_rate(LOCAL_MATMUL_SIZE, repeats=3, device=device)
        extra = {"matmul_gflops": rate} if args.quantity == "time" else {}
        print(json.dumps({**measure_point(name, n, args), **extra}), flush=True)


def run_process(points: list[tuple[str, int]], args: argparse.Namespace) -> list[dict]:
    """``points`` measured in fresh interpreters (`common.run_json_lines`), ``--timeout`` s per point.

    One interpreter measures the peak memory, another the time (their allocator settings differ:
    `common.point_environment`); the compile comparison is timed only.
    """
    command = [sys.executable, "-m", __spec__.name, "--points", *(f"{name}:{n}" for name, n in points)]
    for flag in ("batch", "heads", "head_dim", "features", "repeats", "device", "threads"):
        if getattr(args, flag) is not None:
            command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    command += [f"--repeats-at={n}={r}" for n, r in args.repeats_at] + (["--compile"] if args.compile else [])
    merged: list[dict] = [{"attention": name, "n": n} for name, n in points]
    for quantity in ("time",) if args.compile else QUANTITIES:
        results = run_json_lines(
            [*command, "--quantity", quantity],
            args.timeout * len(points),
            lambda r: (r["attention"], r["n"]),
            points,
            quantity,
        )
        for point, result in zip(merged, results, strict=True):
            if "error" in result:
                point.setdefault("error", result["error"])
            point.update({key: value for key, value in result.items() if key != "error"})
    return merged


def process_groups(args: argparse.Namespace) -> list[list[tuple[str, int]]]:
    """The points of the run, grouped by process as ``--isolation`` says (lengths in increasing order)."""
    lengths = sorted(args.lengths)
    if args.isolation == "point":
        return [[(name, n)] for n in lengths for name in args.attentions]
    by_attention = [[(name, n) for n in lengths] for name in args.attentions]
    return by_attention if args.isolation == "attention" else [[p for group in by_attention for p in group]]


@dataclass(frozen=True)
class Goal:
    """A target one point must reach: ``value(point, softmax point, matmul rate) >= minimum`` (or <=)."""

    label: str
    n: int
    value: Callable[[dict, dict, float], float]
    bound: float
    at_most: bool = False
    applies: Callable[[str], bool] = lambda name: True

    def met(self, point: dict, reference: dict, rate: float) -> bool:
        """Whether ``point`` (at length ``n``) meets the goal against SDPA's ``reference``."""
        value = self.value(point, reference, rate)
        return value <= self.bound if self.at_most else value >= self.bound


def _speed_up(point: dict, reference: dict, rate: float) -> float:
    return float(reference["seconds"] / point["seconds"])


def _memory(point: dict, reference: dict, rate: float) -> float:
    return float(point["peak_mib"] / max(reference["peak_mib"], 0.1))


def _matmul_share(point: dict, reference: dict, rate: float) -> float:
    """GFLOP/s over the matmul rate measured with the point (else the run's)."""
    return float(point["gflops"] / point.get("matmul_gflops", rate))


#: The goals of the random-feature pairs, each against SDPA or the matmul rate measured in the same run.
GOALS = [
    Goal(">= 1x SDPA at 1K", 1024, _speed_up, 1.0),
    Goal(">= 8x SDPA at 8K", 8192, _speed_up, 8.0),
    Goal("memory <= 1.5x SDPA at 8K", 8192, _memory, 1.5, at_most=True),
    Goal("memory <= 1.5x SDPA at 16K", 16384, _memory, 1.5, at_most=True),
    Goal(
        ">= 30 % of the matmul rate at 8K (PosRF)",
        8192,
        _matmul_share,
        0.3,
        applies=lambda name: family(name) == "posrf",
    ),
]


def goal_misses(results: list[dict], rate: float) -> dict[str, tuple[list[str], int]]:
    """For each goal, the pairs that miss it as ``"name (value)"``, and how many pairs it was checked on."""
    pairs = set(rf_pairs())
    points = {(r["attention"], r["n"]): r for r in results if "error" not in r}
    misses: dict[str, tuple[list[str], int]] = {}
    for goal in GOALS:
        reference = points.get(("softmax", goal.n))
        if reference is None:
            continue
        checked = {
            name: point
            for (name, n), point in points.items()
            if n == goal.n and name in pairs and goal.applies(name)
        }
        missed = [
            f"{name} ({goal.value(point, reference, rate):.2f})"
            for name, point in checked.items()
            if not goal.met(point, reference, rate)
        ]
        misses[goal.label] = (missed, len(checked))
    return misses


def table(results: list[dict], args: argparse.Namespace, rate: float) -> str:
    """Markdown: time and memory per attention and N, with ratios to softmax of the same run."""
    from spectraformer_core import markdown_table

    reference = {r["n"]: r for r in results if r["attention"] == "softmax" and "error" not in r}
    performer = {r["n"]: r for r in results if r["attention"] == "performer-pytorch" and "error" not in r}
    header = [
        "attention",
        "N",
        "fwd+bwd ms",
        "speed-up vs softmax",
        "speed-up vs performer-pytorch",
        "peak MiB",
        "memory / softmax",
        "GFLOP/s",
    ]
    rows = []
    for r in results:
        if "error" in r:
            rows.append([r["attention"], str(r["n"]), r["error"], "", "", "", "", ""])
            continue
        ref = reference.get(r["n"])
        speed = f"{ref['seconds'] / r['seconds']:.1f}x" if ref else "n/a"
        fast = performer.get(r["n"])
        vs_performer = f"{fast['seconds'] / r['seconds']:.2f}x" if fast else "n/a"
        memory = f"{r['peak_mib'] / max(ref['peak_mib'], 0.1):.1f}x" if ref else "n/a"
        gflops = "" if r["gflops"] != r["gflops"] else f"{r['gflops']:.1f}"
        row = [
            r["attention"],
            str(r["n"]),
            f"{1000 * r['seconds']:.1f}",
            speed,
            vs_performer,
            f"{r['peak_mib']:.0f}",
            memory,
        ]
        rows.append([*row, gflops])
    return f"{run_description(args, rate)}\n\n" + markdown_table(header, rows)


def run_description(args: argparse.Namespace, rate: float) -> str:
    """The shape, the machine and the matmul rate of a run, one line."""
    shape = f"B={args.batch}, H={args.heads}, Dh={args.head_dim}, {args.features} features"
    return f"{shape}; machine: {args.machine}; float32 matmul rate {rate:.1f} GFLOP/s"


#: Shortest length whose peak memory the summary and the plot show: below it the peaks (a few hundred KiB to a
#: few MiB) are within the granularity of the kernel's resident-size counters (updated in batches of pages).
MEMORY_MIN_LENGTH = 4096
#: Length whose achieved GFLOP/s the summary shows (the matmul-rate goal's), when the run has it.
GFLOPS_LENGTH = 8192


def summary(results: list[dict], args: argparse.Namespace, rate: float) -> str:
    """Markdown: one row per attention (time, speed-up, memory per N; GFLOP/s), then the goals' misses."""
    from spectraformer_core import markdown_table

    lengths = sorted(args.lengths)
    points = {(r["attention"], r["n"]): r for r in results}
    reference = {n: points.get(("softmax", n), {}) for n in lengths}
    header = ["attention"]
    for n in lengths:
        header += [f"{k(n)} ms", f"{k(n)} speed-up"] + [f"{k(n)} memory"] * (n >= MEMORY_MIN_LENGTH)
    rate_length = GFLOPS_LENGTH if GFLOPS_LENGTH in lengths else max(lengths)
    header += [f"{k(rate_length)} GFLOP/s (% of matmul)"]
    operations = operation_counts(args.operations) if args.operations else {}
    if operations:
        header.insert(1, "operations (causal)")
    rows = []
    for name in args.attentions:
        row = [f"`{name}`"]
        if operations:
            row.append(" ".join(operations.get((name, causal), "?") for causal in (False, True)))
        for n in lengths:
            point = points.get((name, n), {"error": "not run"})
            with_memory = n >= MEMORY_MIN_LENGTH
            if "error" in point:
                row += [point["error"], ""] + [""] * with_memory
                continue
            ref = reference[n]
            ok = "error" not in ref and ref
            row += [
                f"{1000 * point['seconds']:,.0f}",
                f"{ref['seconds'] / point['seconds']:.2f}x" if ok else "n/a",
            ]
            if with_memory:
                row.append(f"{_memory(point, ref, rate):.2f}x ({point['peak_mib']:.1f} MiB)" if ok else "n/a")
        last = points.get((name, rate_length), {})
        gflops = last.get("gflops", float("nan"))
        share = f" ({100 * _matmul_share(last, {}, rate):.0f} %)" if last else ""
        row.append("" if gflops != gflops else f"{gflops:.1f}{share}")
        rows.append(row)
    lines = [run_description(args, rate), "", markdown_table(header, rows), ""]
    for label, (missed, checked) in goal_misses(results, rate).items():
        lines.append(f"- {label}: missed by {len(missed)} of {checked} pairs" + (": " if missed else ""))
        if missed:
            lines[-1] += ", ".join(missed)
    return "\n".join(lines) + "\n"


def operation_counts(path: Path) -> dict[tuple[str, bool], str]:
    """``operation_counts.py --out`` rows as ``{(name, causal): "count"}`` at their longest length.

    The non-causal count plain, the causal one in parentheses (``"467"``, ``"(845)"``).
    """
    counts = {}
    for row in json.loads(path.read_text()):
        total = f"{row['operations'][-1]:,}"
        counts[(row["attention"], row["causal"])] = f"({total})" if row["causal"] else total
    return counts


def compile_table(results: list[dict], args: argparse.Namespace) -> str:
    """Markdown: eager and compiled training-step medians per attention and N, and their ratio."""
    from spectraformer_core import markdown_table

    header = ["attention", "N", "eager ms", "compiled ms", "eager / compiled", "compilation s"]
    rows = []
    for r in results:
        if "error" in r:
            rows.append([f"`{r['attention']}`", str(r["n"]), r["error"], "", "", ""])
            continue
        rows.append(
            [
                f"`{r['attention']}`",
                str(r["n"]),
                f"{1000 * r['eager_seconds']:.1f}",
                f"{1000 * r['compiled_seconds']:.1f}",
                f"{r['eager_seconds'] / r['compiled_seconds']:.2f}x",
                f"{r['compile_seconds']:.0f}",
            ]
        )
    shape = f"x ({args.batch}, N, {args.heads * args.head_dim}), {args.heads} heads, {args.features} features"
    return f"{shape}; machine: {args.machine}\n\n" + markdown_table(header, rows)


def family(name: str) -> str:
    """The component of a ``"<component>-<matrix>"`` pair; ``"baselines"`` for every other name."""
    pair = rf_attention.split_pair(name)
    return "baselines" if pair is None else pair[0]


def plot(results: list[dict], path: Path) -> None:
    """Two PNGs of one panel per component family: time, and memory against SDPA's.

    ``path``: time against N, log-log, SDPA in each panel; ``<stem>_memory<suffix>`` beside it: peak memory
    over SDPA's at each length from ``MEMORY_MIN_LENGTH`` (bars, the goal as a line).
    """
    plt = pyplot()

    names = list(dict.fromkeys(r["attention"] for r in results))
    families = list(dict.fromkeys(family(n) for n in names if n != "softmax"))
    points = {(r["attention"], r["n"]): r for r in results if "error" not in r}
    columns = min(3, len(families))
    rows = -(-len(families) // columns)
    colors = plt.get_cmap("tab10").colors

    def panels() -> tuple[Any, Any]:
        return plt.subplots(
            rows,
            columns,
            figsize=(4.4 * columns, 3.6 * rows),
            sharey=True,
            squeeze=False,
            layout="constrained",
        )

    fig, axes = panels()
    for ax, group in zip(axes.flat, families, strict=False):
        for i, name in enumerate(["softmax", *(n for n in names if family(n) == group)]):
            line = sorted((n, 1000 * r["seconds"]) for (a, n), r in points.items() if a == name)
            style = (
                {"lw": 2.2, "color": "black"} if name == "softmax" else {"lw": 1.2, "color": colors[i % 10]}
            )
            label = "SDPA" if name == "softmax" else name.removeprefix(f"{group}-")
            ax.loglog(*zip(*line, strict=True), marker="o", ms=3, label=label, **style)
        ax.set(title=group, xlabel="sequence length N")
        ax.grid(True, which="both", alpha=0.3)
    # one legend below the panels: every family lists its matrices in the same order, so the colours agree
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize=8)
    _finish(fig, axes, len(families), "forward+backward (ms)", path)

    lengths = sorted({n for _, n in points if n >= MEMORY_MIN_LENGTH})
    bound = next(g.bound for g in GOALS if g.value is _memory)
    fig, axes = panels()
    for ax, group in zip(axes.flat, families, strict=False):
        members = [n for n in names if family(n) == group]
        width = 0.8 / max(len(lengths), 1)
        for j, n in enumerate(lengths):
            reference = points.get(("softmax", n))
            ratios = [
                _memory(points[(m, n)], reference, 0.0) if reference and (m, n) in points else 0.0
                for m in members
            ]
            xs = [i + (j - (len(lengths) - 1) / 2) * width for i in range(len(members))]
            ax.bar(xs, ratios, width, label=f"N = {k(n)}", color=colors[j % 10])
        ax.axhline(bound, color="black", lw=1, ls="--", label=f"goal {bound}x")
        ax.set_xticks(
            range(len(members)), [m.removeprefix(f"{group}-") for m in members], rotation=45, fontsize=8
        )
        ax.set(title=group, ylim=(0, 1.35 * bound))
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7, ncol=3, loc="upper center")
    _finish(
        fig, axes, len(families), "peak memory / SDPA's", path.with_name(f"{path.stem}_memory{path.suffix}")
    )


def _finish(fig: Any, axes: Any, used: int, ylabel: str, target: Path) -> None:
    """Hide the unused panels, label the first column, save ``fig`` at ``target``."""
    for ax in axes.flat[used:]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    save_figure(fig, target, dpi=110)  # laid out by its constrained layout


def main(argv: list[str] | None = None) -> None:
    """Measure every point (or, with ``--points``, these in this process) and print the table."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.points:
        measure_points([(p.rsplit(":", 1)[0], int(p.rsplit(":", 1)[1])) for p in args.points], args)
        return
    if args.from_json:  # tables and plots of an earlier run
        run = json.loads(args.from_json.read_text())
        args.machine, rate, results = run["machine"], run["matmul_gflops"], run["results"]
        args.attentions = list(dict.fromkeys(r["attention"] for r in results))
        args.lengths = sorted({r["n"] for r in results})
    else:
        args.machine, rate = machine(args.device), matmul_rate(device=torch.device(args.device))
        results = []
        for group in process_groups(args):
            results += run_process(group, args)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps({"machine": args.machine, "matmul_gflops": rate, "results": results}, indent=1)
        )
    if args.compile:
        print(compile_table(results, args))
        return
    if args.plot:
        plot(results, args.plot)
    if args.summary:
        args.summary.parent.mkdir(parents=True, exist_ok=True)
        args.summary.write_text(summary(results, args, rate))
    print(table(results, args, rate))


if __name__ == "__main__":
    main()
