"""Attention scaling: forward+backward time and peak memory against the sequence length.

For each attention and each N, one fresh process builds ``q, k, v`` of shape ``(B, H, N, Dh)`` (float32,
``requires_grad``), runs one forward+backward at N = 256 first (code pages and allocator pools touched on
first use are not the attention's memory), then one at N to measure the peak memory it adds (CPU: the
resident high-water mark ``VmHWM``, reset through ``/proc/self/clear_refs`` just before, minus the resident
size ``VmRSS`` then, with glibc's mmap threshold fixed so that it counts live tensors; CUDA:
``torch.cuda.max_memory_allocated`` minus the allocated bytes before), then
times ``--repeats`` more runs (median). Every number is reported next to ``softmax``
(``scaled_dot_product_attention``) and ``performer-pytorch`` measured in the same run, with the achieved
GFLOP/s (from an analytic FLOP count) next to the machine's measured float32 matmul rate.

    uv run --frozen nox -s bench                          # everything, as in the docs
    python benchmarks/attention_scaling.py --lengths 1024 2048 --attentions softmax performer
    python benchmarks/attention_scaling.py --device cuda --lengths 4096 65536   # on a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
from pathlib import Path

import torch

import app_common as ac

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


def baseline_options(name: str, n: int) -> dict:
    """Constructor options of the baselines at length ``n``: Table 1's settings.

    No Nystromformer convolution, as in the Skyformer LRA configuration; Linformer sized for exactly ``n``.
    """
    return {"nystromformer": {"conv_kernel_size": None}, "linformer": {"max_seq_len": n}}.get(name, {})


DEFAULT_LENGTHS = [1024, 2048, 4096, 8192, 16384]
#: Length of the forward+backward run before the measured one (not counted).
WARMUP_LENGTH = 256


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--help`` lists them)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attentions", nargs="+", default=DEFAULT_ATTENTIONS)
    parser.add_argument("--lengths", type=int, nargs="+", default=DEFAULT_LENGTHS)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per point")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (CUDA peak: max_memory_allocated)")
    parser.add_argument("--out", type=Path, default=Path("results/bench/attention_scaling.json"))
    parser.add_argument("--plot", type=Path, default=None, help="write a log-log PNG here")
    parser.add_argument("--point", nargs=2, metavar=("ATTENTION", "N"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def build(name: str, n: int, args: argparse.Namespace):
    """``fn(q, k, v) -> out`` for an attention name at length ``n``, on ``(B, H, N, Dh)`` tensors."""
    if name == "performer-pytorch":
        from performer_pytorch import FastAttention

        module = FastAttention(dim_heads=args.head_dim, nb_features=args.features, causal=False)
        return module.to(args.device)
    import rf_attention

    module = rf_attention.create(
        name,
        args.heads * args.head_dim,
        args.heads,
        num_features=args.features,
        seed=0,
        **baseline_options(name, n),
    ).to(args.device)
    return lambda q, k, v: module.attend(q, k, v, None)


def feature_map_of(name: str):
    """The ``rf_features`` feature map an RF attention name builds (None for softmax and the baselines)."""
    import rf_attention

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
    """Run in a fresh process: peak memory of one forward+backward, then the median time of more."""
    torch.manual_seed(0)
    device = torch.device(args.device)
    warm = build(name, WARMUP_LENGTH, args)  # first use loads code pages and fills allocator pools
    small = [torch.randn(args.batch, args.heads, WARMUP_LENGTH, args.head_dim, device=device) for _ in "qkv"]
    warm(*(t.requires_grad_() for t in small)).sum().backward()
    attend = build(name, n, args)
    shape = (args.batch, args.heads, n, args.head_dim)
    q, k, v = (torch.randn(shape, device=device, requires_grad=True) for _ in range(3))
    before = reset_peak(device)
    attend(q, k, v).sum().backward()
    peak_mib = (peak(device) - before) / 2**20

    def clear_grads() -> None:
        for t in (q, k, v):
            t.grad = None

    seconds = ac.median_seconds(
        lambda: attend(q, k, v).sum().backward(),
        repeats=args.repeats,
        warmup=0,
        device=device,
        setup=clear_grads,
    )
    return {
        "attention": name,
        "n": n,
        "seconds": seconds,
        "peak_mib": peak_mib,
        "gflops": flops(name, n, args) / seconds / 1e9,
    }


def synchronize(device: torch.device) -> None:
    """Wait for queued CUDA work (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> int:
    """Reset the peak memory counter; return the current bytes (CUDA: allocated; CPU: resident)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    return 1024 * reset_peak_rss_kib()


def peak(device: torch.device) -> int:
    """Peak bytes since `reset_peak` (CUDA: ``max_memory_allocated``; CPU: resident high-water)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)
    return 1024 * peak_rss_kib()


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak_rss_kib() -> int:
    """Reset the peak resident size to the current one and return it (KiB)."""
    if Path("/proc/self/clear_refs").exists():
        Path("/proc/self/clear_refs").write_text("5")
        return _status_kib("VmRSS")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # elsewhere: peak so far, not resettable


def peak_rss_kib() -> int:
    """Peak resident size since the last reset (KiB)."""
    if Path("/proc/self/clear_refs").exists():
        return _status_kib("VmHWM")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def matmul_rate(size: int = 2048, repeats: int = 5, device: torch.device | None = None) -> float:
    """Measured float32 matmul GFLOP/s of this machine (``size x size`` by ``size x size``)."""
    device = device or torch.device("cpu")
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    return 2 * size**3 / ac.median_seconds(lambda: a @ b, repeats=repeats, device=device) / 1e9


def machine(device: str = "cpu") -> str:
    """The device's name (``app_common.device_name``), cores, threads and library versions."""
    name = ac.device_name(torch.device(device))
    if device.startswith("cuda"):
        return f"{name}, PyTorch {torch.__version__}, CUDA {torch.version.cuda}"
    return (
        f"{name}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, "
        f"PyTorch {torch.__version__}, Python {platform.python_version()}"
    )


#: glibc's malloc serves blocks of at least this many bytes by ``mmap`` and unmaps them when freed, so the
#: resident high-water mark counts the tensors alive at once, not heap pages a freed tensor left behind
#: (glibc otherwise raises the threshold as large blocks are freed, and the peak then depends on the order
#: of allocations). Every point, SDPA's included, runs with it.
MMAP_THRESHOLD_BYTES = 128 * 1024


def point_environment() -> dict[str, str]:
    """The environment of a point's process: this one's, with a fixed malloc mmap threshold (glibc)."""
    return {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES), **os.environ}


def run_point(name: str, n: int, args: argparse.Namespace) -> dict:
    """One point in a fresh interpreter, so peak RSS belongs to this point alone."""
    command = [sys.executable, __file__, "--point", name, str(n)]
    for flag in ("batch", "heads", "head_dim", "features", "repeats", "device", "threads"):
        if getattr(args, flag) is not None:
            command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=args.timeout,
            check=False,
            env=point_environment(),
        )
    except subprocess.TimeoutExpired:
        return {"attention": name, "n": n, "error": f"timeout after {args.timeout:.0f} s"}
    if done.returncode != 0:
        return {"attention": name, "n": n, "error": done.stderr.strip().splitlines()[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


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
    shape = f"B={args.batch}, H={args.heads}, Dh={args.head_dim}, {args.features} features"
    return (
        f"{shape}; machine: {machine(args.device)}; float32 matmul rate {rate:.0f} GFLOP/s\n\n"
        + markdown_table(header, rows)
    )


def plot(results: list[dict], path: Path) -> None:
    """Log-log time and memory against N, one line per attention."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), layout="constrained")
    names = list(dict.fromkeys(r["attention"] for r in results))
    colors = plt.get_cmap("tab20").colors
    for i, name in enumerate(names):
        points = [r for r in results if r["attention"] == name and "error" not in r]
        ns = [r["n"] for r in points]
        random_features = ("-" in name and name != "performer-pytorch") or name == "performer"
        style = {"lw": 1.2, "color": colors[i % len(colors)], "ls": "-" if random_features else "--"}
        if name == "softmax":
            style = {"lw": 2.5, "color": "black"}
        axes[0].loglog(ns, [1000 * r["seconds"] for r in points], marker="o", label=name, **style)
        axes[1].loglog(ns, [max(r["peak_mib"], 0.1) for r in points], marker="o", label=name, **style)
    axes[0].set(xlabel="sequence length N", ylabel="forward+backward (ms)")
    axes[1].set(xlabel="sequence length N", ylabel="peak memory added (MiB)")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    # beside the axes: with every pair (51 lines) a legend inside would cover the data
    fig.legend(
        *axes[0].get_legend_handles_labels(), fontsize=7, ncol=1 + len(names) // 18, loc="outside right"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")


def main(argv: list[str] | None = None) -> None:
    """Measure every point (or one, with ``--point``) and print the table."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.point:
        print(json.dumps(measure_point(args.point[0], int(args.point[1]), args)))
        return
    rate = matmul_rate(device=torch.device(args.device))
    results = []
    for n in args.lengths:
        for name in args.attentions:
            results.append(run_point(name, n, args))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"machine": machine(args.device), "matmul_gflops": rate, "results": results}, indent=1)
    )
    if args.plot:
        plot(results, args.plot)
    print(table(results, args, rate))


if __name__ == "__main__":
    main()
