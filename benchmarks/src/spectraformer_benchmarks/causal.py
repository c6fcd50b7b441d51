"""Causal attention: speed, memory and matmul FLOPs per token of RF attention against causal SDPA.

Shape: ``q, k, v`` of ``(1, 4, N, 64)`` (a language model's head size), float32, 128 random features.

``--part measure``: forward+backward of ``rf_attention.rf_attention(q, k, v, feature_map, causal=True)`` (the
pair's feature map with running statistics, as a causal module builds it) and of
``scaled_dot_product_attention(q, k, v, is_causal=True)`` (the ``softmax`` row), a fresh process per point
(one attention at one N, time or memory), each with one forward+backward at N = 256 first (code pages and
allocator pools touched on first use are not the attention's). At ``--memory-lengths`` one forward+backward
gives the peak memory (``app_common.measure.PeakMemoryMeter``: the resident high-water mark above the resident
size just before, glibc's mmap threshold fixed at 128 KiB so that it counts the tensors alive at once; on CUDA
the allocator's peak); at ``--lengths`` a process with the allocator as users run it times ``1 + --repeats``
of them (``--repeats-at N=R`` at one length), the time is their median. Ratios are SDPA's time over the pair's
(speed) and the pair's peak over SDPA's (memory), at the same N, in the same run.

An attention named ``<pair>@inductor`` is the same pair under ``torch.compile(backend="inductor")``: its
warm-up runs at the measured N itself (the compilation is not timed), then it is timed as the others.

``--part flops``: matmul FLOPs of one forward+backward (``torch.utils.flop_counter.FlopCounterMode``) per
token, causal and not, every pair and SDPA, at each of ``--flop-lengths``. The inputs are fake tensors
(``FakeTensorMode``: shapes only, nothing computed, so 64K costs what 1K does); an attention whose code needs
real values is counted on real tensors instead. The count is deterministic.

``--table DIR``: the Performance page's causal table from the JSON files the parts (and
``operation_counts --out``) wrote under DIR. ``benchmarks/run_causal_table.sh`` runs every part.

    python -m spectraformer_benchmarks.causal --part measure --lengths 1024 8192 --memory-lengths 8192 \
        --out results/bench/causal
    python -m spectraformer_benchmarks.causal --part flops --attentions pairs --out results/bench/causal
    python -m spectraformer_benchmarks.causal --table results/bench/causal
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
    UnsupportedOperatorException,
)

import rf_attention
import rf_features
from app_common.measure import PeakMemoryMeter, Timer
from app_common.plots import pyplot, save_figure
from spectraformer_benchmarks.common import (
    QUANTITIES,
    add_repeats_arguments,
    command_line,
    expand_pairs,
    k,
    machine,
    repeats_at,
    run_json_lines,
)
from spectraformer_benchmarks.counting import matmul_flops

#: The representative pairs of the timed part: one per component family, different matrices.
DEFAULT_ATTENTIONS = [
    "softmax",
    "posrf-orf",
    "oprf-fastfoodl",
    "gerf-qmc",
    "saderf-sorf",
    "posrf-hyp-orf",
    "trigrf-sorf",
]
#: The suffix of an attention name that times it under ``torch.compile`` with this backend.
COMPILED = "@inductor"
#: The causal speed goals: SDPA's time over the pair's at these lengths.
CAUSAL_GOALS = {1024: 0.8, 8192: 6.0, 16384: 12.0}
#: Lengths of the speed columns and of the memory columns of the table.
SPEED_LENGTHS = (1024, 8192, 16384)
MEMORY_LENGTHS = (8192, 32768)
FLOP_LENGTHS = [1024, 4096, 16384, 65536]
#: The FLOP columns of the table (per token at these lengths, and their ratio).
FLOP_COLUMNS = (4096, 65536)
#: The operation-count columns (``operation_counts --causal yes --lengths 1024 65536 --out ...``).
OPERATION_COLUMNS = (1024, 65536)
WARMUP_LENGTH = 256
BATCH, HEADS, HEAD_DIM, FEATURES = 1, 4, 64, 128


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--help`` lists them)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["measure", "flops"], default=None)
    parser.add_argument("--table", type=Path, default=None, metavar="DIR", help="print the table of DIR")
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="PNG",
        help="with --table: the figure of DIR's measure.json",
    )
    parser.add_argument(
        "--attentions", nargs="+", default=None, help="'pairs': every RF pair (default per part: see --help)"
    )
    parser.add_argument(
        "--lengths", type=int, nargs="+", default=list(SPEED_LENGTHS), help="--part measure: timed lengths"
    )
    parser.add_argument(
        "--memory-lengths",
        type=int,
        nargs="*",
        default=list(MEMORY_LENGTHS),
        help="--part measure: lengths whose peak memory is measured (none: time only)",
    )
    parser.add_argument("--flop-lengths", type=int, nargs="+", default=FLOP_LENGTHS, help="--part flops")
    add_repeats_arguments(parser, 3, "timed runs per point after the first")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per point")
    parser.add_argument("--out", type=Path, default=Path("results/bench/causal"), help="folder of the JSON")
    parser.add_argument("--points", nargs="+", metavar="ATTENTION:N", help=argparse.SUPPRESS)
    parser.add_argument("--quantity", choices=QUANTITIES, default="time", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.part is None and args.table is None and not args.points:
        parser.error("give --part measure, --part flops or --table DIR")
    default = ["softmax", "pairs"] if args.part == "flops" else DEFAULT_ATTENTIONS
    args.attentions = expand_pairs(args.attentions or default)
    return args


def attention_step(
    name: str, n: int, *, causal: bool = True, device: torch.device | str = "cpu", fake: bool = False
) -> Callable[[], None]:
    """One forward+backward of attention ``name`` on fresh ``q, k, v (1, 4, n, 64)`` (``requires_grad``).

    ``softmax``: ``scaled_dot_product_attention`` (``rf_attention.softmax_attention``); a pair:
    ``rf_attention.rf_attention`` with the pair's feature map (seed 0; running statistics when causal, as
    the causal modules build it). ``fake``: ``q, k, v`` are fake tensors and the step runs under their
    ``FakeTensorMode`` (shapes only, nothing computed); the feature map stays real. ``<name>@inductor``:
    the attention under ``torch.compile(backend="inductor")``.
    """
    device = torch.device(device)
    attend: Callable[..., torch.Tensor]
    compiled = name.endswith(COMPILED)
    name = name.removesuffix(COMPILED)
    if name == "softmax":
        attend = functools.partial(rf_attention.softmax_attention, causal=causal)
    else:
        pair = rf_attention.split_pair(name)
        if pair is None:
            raise ValueError(f"attention: expected softmax or a '<component>-<matrix>' pair, got {name!r}")
        fm = rf_features.create(
            pair[0],
            weight_matrix=pair[1],
            num_features=FEATURES,
            dim=HEAD_DIM,
            seed=0,
            statistics_mode="running" if causal else "batch",
        ).to(device)
        attend = functools.partial(rf_attention.rf_attention, feature_map=fm, causal=causal)
    if compiled:
        attend = torch.compile(attend, backend="inductor", dynamic=False)
    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    with mode:
        q, k_, v = (torch.randn(BATCH, HEADS, n, HEAD_DIM, device=device, requires_grad=True) for _ in "qkv")

    def step() -> None:
        with mode:
            attend(q, k_, v).sum().backward()

    return step


def flops_per_token(name: str, n: int, *, causal: bool) -> float:
    """Matmul FLOPs of one forward+backward of ``name`` at length ``n`` over the ``n`` tokens (B = 1).

    Counted on fake tensors; on real ones where the attention's code needs values (a data-dependent op).
    """
    try:
        return matmul_flops(attention_step(name, n, causal=causal, fake=True)) / (BATCH * n)
    except (DataDependentOutputException, DynamicOutputShapeException, UnsupportedOperatorException):
        return matmul_flops(attention_step(name, n, causal=causal)) / (BATCH * n)


def measure_points(points: list[tuple[str, int]], args: argparse.Namespace) -> None:
    """In a fresh process: a warm-up forward+backward, then each point's ``args.quantity``, printed as JSON.

    Memory: the peak of one forward+backward; time: the median of ``1 + repeats`` of them. A compiled
    attention warms up at the point's own length (it compiles for that shape there).
    """
    device = torch.device(args.device)
    warmed: set[str] = set()
    for name, n in points:
        if name not in warmed and not name.endswith(COMPILED):
            warmed.add(name)
            attention_step(name, WARMUP_LENGTH, device=device)()
        torch.manual_seed(0)
        step = attention_step(name, n, device=device)
        if name.endswith(COMPILED):
            step()
        if args.quantity == "memory":
            with PeakMemoryMeter(device) as meter:
                step()
            print(json.dumps({"attention": name, "n": n, "peak_mib": meter.added / 2**20}), flush=True)
            continue
        samples = []
        for _ in range(1 + repeats_at(n, args)):
            with Timer(device) as timer:
                step()
            samples.append(timer.elapsed)
        result = {"attention": name, "n": n, "seconds": statistics.median(samples), "samples": len(samples)}
        print(json.dumps(result), flush=True)


def measure_main(args: argparse.Namespace) -> dict:
    """Every (attention, N, quantity) point in its own process, the lengths in increasing order.

    Time at ``--lengths``, memory at ``--memory-lengths`` (`common.point_environment` says why apart).
    """
    results = []
    wanted = [(n, "time") for n in args.lengths] + [(n, "memory") for n in args.memory_lengths]
    for n, quantity in sorted(wanted):
        for name in args.attentions:
            command = [sys.executable, "-m", __spec__.name, "--points", f"{name}:{n}", "--quantity", quantity]
            command += [
                "--threads",
                str(args.threads),
                "--device",
                args.device,
                "--repeats",
                str(args.repeats),
            ]
            command += [f"--repeats-at={length}={r}" for length, r in args.repeats_at]
            (result,) = run_json_lines(
                command, args.timeout, lambda r: (r["attention"], r["n"]), [(name, n)], quantity
            )
            results.append({"attention": name, "n": n, "quantity": quantity, **result})
    return {"results": results}


def flops_main(args: argparse.Namespace) -> dict:
    """Matmul FLOPs per token of every attention, causal and not, at every ``--flop-lengths`` N."""
    rows = []
    for name in args.attentions:
        for causal in (True, False):
            per_token = {n: flops_per_token(name, n, causal=causal) for n in sorted(args.flop_lengths)}
            rows.append({"attention": name, "causal": causal, "flops_per_token": per_token})
            cells = ", ".join(f"{k(n)}: {f / 1e6:.3f}" for n, f in per_token.items())
            print(
                f"{name}{' causal' if causal else ''}: MFLOP per token {cells}", file=sys.stderr, flush=True
            )
    return {"results": rows}


def _load(folder: Path, name: str) -> dict | list | None:
    path = folder / name
    return json.loads(path.read_text()) if path.is_file() else None


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def table(folder: Path) -> str:
    """Markdown: the causal table of the Performance page, and the every-pair FLOPs and decode counts.

    Reads ``measure.json``, ``flops.json`` (this module), ``operations.json`` (``operation_counts --causal
    yes --lengths 1024 65536``) and ``decode.json`` (``operation_counts --decode``) under ``folder``; a
    missing file leaves its columns as ``-``.
    """
    from spectraformer_core import markdown_table

    measure = _load(folder, "measure.json") or {"results": []}
    flops = _load(folder, "flops.json") or {"results": []}
    points = {(r["attention"], r["n"], r["quantity"]): r for r in measure["results"] if "error" not in r}
    per_token = {
        (r["attention"], r["causal"]): {int(n): f for n, f in r["flops_per_token"].items()}
        for r in flops["results"]
    }
    operations = {
        (r["attention"], n): count
        for r in _load(folder, "operations.json") or []
        if r["causal"]
        for n, count in zip(r["lengths"], r["operations"], strict=True)
    }
    decode = {r["attention"]: r["decode_step"] for r in _load(folder, "decode.json") or []}

    def speed(name: str, n: int) -> str:
        point, sdpa = points.get((name, n, "time")), points.get(("softmax", n, "time"))
        return _ratio(sdpa["seconds"] / point["seconds"] if point and sdpa else None)

    def memory(name: str, n: int) -> str:
        point, sdpa = points.get((name, n, "memory")), points.get(("softmax", n, "memory"))
        return _ratio(point["peak_mib"] / max(sdpa["peak_mib"], 0.1) if point and sdpa else None)

    def flop_cells(name: str, causal: bool) -> list[str]:
        counts = per_token.get((name, causal), {})
        cells = [f"{counts[n] / 1e6:.2f}" if n in counts else "-" for n in FLOP_COLUMNS]
        first, last = (counts.get(n) for n in FLOP_COLUMNS)
        return [*cells, _ratio(last / first if first and last else None)]

    def count(value: int | None) -> str:
        return "-" if value is None else f"{value:,}"

    names = list(dict.fromkeys(r["attention"] for r in measure["results"])) or DEFAULT_ATTENTIONS
    header = ["attention"]
    header += [f"speed {k(n)}" for n in SPEED_LENGTHS] + [f"memory {k(n)}" for n in MEMORY_LENGTHS]
    header += [f"MFLOP/token {k(n)}" for n in FLOP_COLUMNS] + [f"{k(FLOP_COLUMNS[1])} / {k(FLOP_COLUMNS[0])}"]
    header += [f"operations {k(n)}" for n in OPERATION_COLUMNS] + ["decode step operations"]
    rows = []
    for name in names:
        row = [
            f"`{name}`",
            *(speed(name, n) for n in SPEED_LENGTHS),
            *(memory(name, n) for n in MEMORY_LENGTHS),
        ]
        row += flop_cells(name, True)
        row += [count(operations.get((name, n))) for n in OPERATION_COLUMNS] + [count(decode.get(name))]
        rows.append(row)
    timed = [
        f"{k(n)}: {points[('softmax', n, 'time')]['seconds'] * 1e3:,.0f} ms"
        for n in SPEED_LENGTHS
        if ("softmax", n, "time") in points
    ]
    peaks = [
        f"{k(n)}: {points[('softmax', n, 'memory')]['peak_mib']:.1f} MiB"
        for n in MEMORY_LENGTHS
        if ("softmax", n, "memory") in points
    ]
    sdpa = ", ".join(timed + peaks)
    lines = [
        f"Causal, q/k/v (1, 4, N, 64), {FEATURES} features, forward+backward; "
        f"machine: {measure.get('machine', '-')}",
        f"Command: `{measure.get('command', '-')}`; SDPA (is_causal=True): {sdpa or '-'}",
        "",
        markdown_table(header, rows),
        "",
        "Every pair: matmul MFLOP per token of one forward+backward, causal and non-causal, and the "
        f"operations of a decode step (softmax's KV-cache step: {count(decode.get('softmax'))}). "
        f"Command: `{flops.get('command', '-')}`",
        "",
    ]
    header = ["attention", *(f"{k(n)}" for n in FLOP_COLUMNS), "ratio"]
    header += [*(f"{k(n)} non-causal" for n in FLOP_COLUMNS), "ratio non-causal", "decode step operations"]
    rows = [
        [f"`{name}`", *flop_cells(name, True), *flop_cells(name, False), count(decode.get(name))]
        for name in sorted({a for a, _ in per_token} - {"softmax"})
    ]
    lines.append(markdown_table(header, rows))
    return "\n".join(lines) + "\n"


def plot(folder: Path, path: Path) -> Path:
    """The causal figure of ``folder``'s ``measure.json``: time against N, and speed-up over SDPA against N.

    Left: forward+backward time (log-log) of SDPA (black), each pair eager (solid) and under
    ``torch.compile`` (``@inductor``, dashed, the pair's colour). Right: SDPA's time over each one's at the
    same N, the goals (0.8x at 1K, 6x at 8K, 12x at 16K) as crosses.
    """
    plt = pyplot()

    measure = _load(folder, "measure.json") or {"results": []}
    times: dict[str, dict[int, float]] = {}
    for r in measure["results"]:
        if r["quantity"] == "time" and "error" not in r:
            times.setdefault(r["attention"], {})[r["n"]] = r["seconds"]
    sdpa = times.get("softmax", {})
    pairs = list(dict.fromkeys(name.removesuffix(COMPILED) for name in times if name != "softmax"))
    colors = plt.get_cmap("tab10").colors
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    if sdpa:
        left.loglog(*zip(*sorted(sdpa.items()), strict=True), "o-", color="black", lw=2.2, ms=3, label="SDPA")
    for i, pair in enumerate(pairs):
        for name, style in ((pair, "-"), (pair + COMPILED, "--")):
            if name not in times:
                continue
            line = sorted(times[name].items())
            label = pair if style == "-" else f"{pair} compiled"
            ns, seconds = zip(*line, strict=True)
            left.loglog(ns, seconds, style, marker="o", ms=3, color=colors[i % 10], lw=1.2, label=label)
            ratios = [(n, sdpa[n] / t) for n, t in line if n in sdpa]
            if ratios:
                right.semilogx(
                    *zip(*ratios, strict=True), style, marker="o", ms=3, color=colors[i % 10], lw=1.2
                )
    right.plot(list(CAUSAL_GOALS), list(CAUSAL_GOALS.values()), "kx", ms=8, mew=2, label="goal")
    right.axhline(1.0, color="black", lw=0.8)
    left.set(xlabel="sequence length N", ylabel="causal forward+backward (s)")
    right.set(xlabel="sequence length N", ylabel="speed-up over SDPA (x)")
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=7, ncol=2)
    right.legend(fontsize=7)
    fig.suptitle(
        f"Causal, q/k/v (1, 4, N, 64), {FEATURES} features; {measure.get('machine', '-')}", fontsize=9
    )
    return save_figure(fig, path, dpi=110)  # laid out by its constrained layout


def main(argv: list[str] | None = None) -> None:
    """Run the part (writing ``<part>.json`` under ``--out``) or print the table of a folder."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.points:
        measure_points([(p.rsplit(":", 1)[0], int(p.rsplit(":", 1)[1])) for p in args.points], args)
        return
    if args.part is not None:
        run = measure_main(args) if args.part == "measure" else flops_main(args)
        run = {"machine": machine(args.device), "command": command_line(), **run}
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.part}.json").write_text(json.dumps(run, indent=1))
    print(table(args.table or args.out))
    if args.plot is not None:
        print(plot(args.table or args.out, args.plot))


if __name__ == "__main__":
    main()
