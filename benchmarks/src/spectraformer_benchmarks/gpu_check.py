"""GPU check: rf-attention's speed, memory, operation counts and compiled steps on a device.

Parts, one command, a Markdown report under ``--out``:

1. scaling: `attention_scaling` on the device (fresh process per point; on CUDA the peak is
   ``torch.cuda.max_memory_allocated``), 4K to 64K against SDPA (flash/memory-efficient kernels);
2. decoding: `decoding` (per-token latency against the context);
3. operations: aten calls per training forward+backward (`counting.training_step`) of a few pairs at two
   lengths: the kernel launches a step issues, which must not grow with N;
4. compile: ``torch.compile(module, fullgraph=True)`` training steps on the device (inductor; Triton on
   CUDA): no recompilation over repeated steps (one stops the run), the largest difference from eager,
   median step time against eager;
5. flash: forward+backward of ``rf_attention`` against ``scaled_dot_product_attention`` (flash on CUDA) at
   ``B = 8, H = 8, Dh = 64``, N = 4K to 64K, non-causal against SDPA and causal against SDPA with
   ``is_causal=True``, time and peak memory, in one process.

Correctness on the device (outputs and gradients against the float64 references, float32 and bfloat16;
compiled steps against eager) is the benchmarks' test ``tests/test_devices.py``, whose ``cuda`` cases run
where a GPU is:
``pytest benchmarks/tests/test_devices.py -k cuda``.

    python -m spectraformer_benchmarks.gpu_check                          # on a CUDA machine
    python -m spectraformer_benchmarks.gpu_check --device cpu --smoke     # the same code paths, small sizes
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

import rf_attention
import rf_features
from app_common.measure import PeakMemoryMeter, median_seconds
from rf_attention import rf_attention as rf_attention_fn
from rf_attention import softmax_attention
from spectraformer_benchmarks.counting import operations as count_operations
from spectraformer_benchmarks.counting import training_step

SCALING_ATTENTIONS = [
    "softmax",
    "performer",
    "performer-pytorch",
    "oprf-fastfoodl",
    "saderf-orf",
    "trigrf-sorf",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--help`` lists them)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--smoke", "--quick", dest="quick", action="store_true", help="small sizes (a CPU smoke run)"
    )
    parser.add_argument("--lengths", type=int, nargs="+", default=None, help="scaling lengths")
    parser.add_argument("--out", type=Path, default=Path("results/gpu_check"))
    parser.add_argument("--skip", nargs="*", default=[], choices=PARTS)
    return parser.parse_args(argv)


PARTS = ["scaling", "decoding", "operations", "compile", "flash"]
#: Pairs of the operation-count, compile and SDPA parts (causal and not).
KERNEL_PAIRS = ["posrf-orf", "oprf-fastfoodl", "trigrf-sorf"]


def operations(device: torch.device, quick: bool) -> list[str]:
    """Markdown rows: aten calls per training forward+backward of each pair at two lengths."""
    lengths = [256, 1024] if quick else [4096, 65536]
    rows = ["| attention | " + " | ".join(f"N = {n}" for n in lengths) + " |", "|---|---|---|"]
    for name in ["softmax", *KERNEL_PAIRS]:
        for causal in (False, True):
            with torch.device(device):
                totals = [
                    count_operations(
                        training_step(name, n, causal=causal, batch=1, dim=512, heads=8, features=128)
                    )
                    for n in lengths
                ]
            label = f"{name} causal" if causal else name
            rows.append(f"| {label} | " + " | ".join(f"{t:,}" for t in totals) + " |")
    return rows


def _seconds(step: Any, device: torch.device, repeats: int) -> float:
    """Median seconds of ``step()`` over ``repeats`` runs, no warm-up (the caller has run it)."""
    return median_seconds(step, repeats=repeats, warmup=0, device=device)


def _train_step(module: torch.nn.Module, x: torch.Tensor) -> None:
    module(x).square().sum().backward()


def compiled_steps(device: torch.device, quick: bool) -> list[str]:
    """Markdown rows: compiled (fullgraph) against eager training steps, and their largest difference."""
    b, n, dim = (2, 256, 64) if quick else (8, 4096, 512)
    rows = ["| attention | eager ms | compiled ms | speed-up | max abs difference |", "|---|---|---|---|---|"]
    cases = [(KERNEL_PAIRS[0], True)] if quick else [(n, c) for n in KERNEL_PAIRS for c in (False, True)]
    for name, causal in cases:
        torch._dynamo.reset()
        torch.manual_seed(0)
        module = rf_attention.create(name, dim, 8, num_features=128, causal=causal, seed=0)
        module = module.to(device).eval()  # fixed statistics: eager and compiled see the same ones
        eager = copy.deepcopy(module)
        compiled = torch.compile(module, fullgraph=True)
        x = torch.randn(b, n, dim, device=device)
        with torch._dynamo.config.patch(error_on_recompile=True):
            for _ in range(2):  # first call compiles; the second must not recompile
                _train_step(compiled, x)
            # with gradient (grad mode is part of the compiled graph's guards), detached for the number
            difference = float((compiled(x) - eager(x)).detach().abs().max())
            repeats = 3 if quick else 10
            t_compiled = _seconds(functools.partial(_train_step, compiled, x), device, repeats)
        t_eager = _seconds(functools.partial(_train_step, eager, x), device, repeats)
        label = f"{name} causal" if causal else name
        rows.append(
            f"| {label} | {t_eager * 1e3:.1f} | {t_compiled * 1e3:.1f} | {t_eager / t_compiled:.2f}x | "
            f"{difference:.1e} |"
        )
    return rows


def _sdpa_step(name: str, causal: bool, n: int, shape: tuple[int, int, int], device: torch.device) -> Any:
    """A forward+backward of attention ``name`` (SDPA for ``softmax``) on fresh ``q, k, v (B, H, n, Dh)``."""
    b, h, dh = shape
    q, k, v = (torch.randn(b, h, n, dh, device=device, requires_grad=True) for _ in range(3))
    if name == "softmax":
        return lambda: softmax_attention(q, k, v, causal=causal).sum().backward()
    pair = rf_attention.split_pair(name)
    assert pair is not None, name
    fm = rf_features.create(
        pair[0],
        weight_matrix=pair[1],
        num_features=128,
        dim=dh,
        seed=0,
        statistics_mode="running" if causal else "batch",
    ).to(device)
    return lambda: rf_attention_fn(q, k, v, fm, causal=causal).sum().backward()


def against_sdpa(device: torch.device, quick: bool) -> list[str]:
    """Markdown rows: forward+backward time and peak memory of RF attention against SDPA (B=8, H=8, Dh=64).

    Non-causal rows against non-causal SDPA, causal rows against SDPA with ``is_causal=True`` (flash on
    CUDA), each at the same N.
    """
    shape = (1, 2, 16) if quick else (8, 8, 64)
    lengths = [256, 512] if quick else [4096, 8192, 16384, 32768, 65536]
    rows = ["| attention | N | ms | speed-up | peak MiB | memory |", "|---|---|---|---|---|---|"]
    for n in lengths:
        for causal in (False, True):
            reference: tuple[float, float] | None = None
            for name in ["softmax", *KERNEL_PAIRS]:
                step = _sdpa_step(name, causal, n, shape, device)
                step()
                with PeakMemoryMeter(device) as meter:
                    seconds = _seconds(step, device, 3)
                peak = meter.added / 2**20
                if name == "softmax":
                    reference = (seconds, max(peak, 1e-9))
                assert reference is not None
                label = f"{name} causal" if causal else name
                rows.append(
                    f"| {label} | {n} | {seconds * 1e3:.1f} | {reference[0] / seconds:.2f}x | {peak:.0f} | "
                    f"{peak / reference[1]:.2f}x |"
                )
    return rows


def run(command: list[str]) -> tuple[int, str]:
    """Run a benchmark script; its exit code and output."""
    print("$", " ".join(command), flush=True)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    return done.returncode, done.stdout + done.stderr[-4000:]


def main(argv: list[str] | None = None) -> None:
    """Run the parts not skipped and write ``report.md`` under ``--out``."""
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here; use --device cpu --quick for a CPU run")
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    report = [f"# GPU check on {name} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", ""]
    failed = False
    if "scaling" not in args.skip:
        lengths = args.lengths or ([256, 1024] if args.quick else [4096, 8192, 16384, 32768, 65536])
        attentions = [a for a in SCALING_ATTENTIONS if a != "performer-pytorch" or _has("performer_pytorch")]
        code, output = run(
            [
                sys.executable,
                "-m",
                "spectraformer_benchmarks.attention_scaling",
                "--device",
                args.device,
                "--repeats",
                "3",
                "--lengths",
                *map(str, lengths),
                "--attentions",
                *attentions,
                "--out",
                str(args.out / "scaling.json"),
                "--plot",
                str(args.out / "scaling.png"),
            ]
        )
        failed |= code != 0
        report += ["## Scaling", "", output.split("\n{", 1)[0] if code == 0 else output, ""]
    if "decoding" not in args.skip:
        contexts = ["256", "1024"] if args.quick else ["1024", "4096", "16384", "65536"]
        code, output = run(
            [
                sys.executable,
                "-m",
                "spectraformer_benchmarks.decoding",
                "--contexts",
                *contexts,
                "--plot",
                str(args.out / "decoding.png"),
            ]
        )
        failed |= code != 0
        report += ["## Decoding (the benchmark runs on the CPU: it has no device option)", "", output, ""]
    if "operations" not in args.skip:
        report += ["## Operations per training forward+backward (B = 1, dim 512, 8 heads)", ""]
        report += [*operations(device, args.quick), ""]
    if "compile" not in args.skip:
        report += ["## torch.compile(fullgraph=True) training step against eager", ""]
        report += [*compiled_steps(device, args.quick), ""]
    if "flash" not in args.skip:
        report += [
            "## Forward+backward against SDPA",
            "",
            "Speed-up: SDPA's time / the row's; memory: the row's peak / SDPA's; causal rows against SDPA "
            "with is_causal=True.",
            "",
        ]
        report += [*against_sdpa(device, args.quick), ""]
    (args.out / "report.md").write_text("\n".join(report))
    print("\n".join(report))
    if failed:
        raise SystemExit(1)


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    main()
