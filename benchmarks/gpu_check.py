"""GPU check: rf-attention against its float64 references on the device, then speed, memory and decoding.

Three parts, one command, a Markdown report under ``--out``:

1. correctness: every component with an unstructured and a learnable matrix, causal and not, with key
   padding, in float32 and bfloat16 on the device: outputs and gradients (``dq, dk, dv`` and the matrix
   parameters) against ``rf_attention.naive`` in float64 on the CPU, same feature map; softmax likewise;
2. scaling: ``attention_scaling.py --device <device>`` (fresh process per point; on CUDA the peak is
   ``torch.cuda.max_memory_allocated``), 4K to 64K against SDPA (flash/memory-efficient kernels);
3. decoding: ``decoding.py`` (per-token latency against the context), when that benchmark is present;
4. operations: aten calls per training forward+backward (``operation_counts.py``'s counter) of a few pairs
   at two lengths: the kernel launches a step issues, which must not grow with N;
5. compile: ``torch.compile(module, fullgraph=True)`` training steps on the device (inductor; Triton on
   CUDA): no recompilation over repeated steps, outputs equal to eager, median step time against eager;
6. flash: forward+backward of ``rf_attention`` against ``scaled_dot_product_attention`` (flash on CUDA) at
   ``B = 8, H = 8, Dh = 64``, N = 4K to 64K, time and peak memory, in one process.

    python benchmarks/gpu_check.py                          # on a CUDA machine
    python benchmarks/gpu_check.py --device cpu --smoke     # the same code paths on the CPU, small sizes
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

import rf_attention
import rf_features
from rf_attention import rf_attention as rf_attention_fn
from rf_attention import softmax_attention
from rf_attention.naive import naive_rf_attention, naive_softmax_attention

HERE = Path(__file__).resolve().parent
#: Largest relative error of outputs and gradients accepted per dtype (bfloat16 inputs, float32 sums).
TOLERANCE = {torch.float32: 2e-3, torch.bfloat16: 6e-2}
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


PARTS = ["correctness", "scaling", "decoding", "operations", "compile", "flash"]
#: Pairs of the operation-count, compile and SDPA parts (causal and not).
KERNEL_PAIRS = ["posrf-orf", "oprf-fastfoodl", "trigrf-sorf"]


def operations(device: torch.device, quick: bool) -> list[str]:
    """Markdown rows: aten calls per training forward+backward of each pair at two lengths."""
    sys.path.insert(0, str(HERE))
    from operation_counts import count_step

    lengths = [256, 1024] if quick else [4096, 65536]
    rows = ["| attention | " + " | ".join(f"N = {n}" for n in lengths) + " |", "|---|---|---|"]
    for name in ["softmax", *KERNEL_PAIRS]:
        for causal in (False, True):
            with torch.device(device):
                totals = [
                    sum(count_step(name, n, causal=causal, batch=1, dim=512, heads=8, features=128).values())
                    for n in lengths
                ]
            label = f"{name} causal" if causal else name
            rows.append(f"| {label} | " + " | ".join(f"{t:,}" for t in totals) + " |")
    return rows


def _seconds(step: Any, device: torch.device, repeats: int) -> float:
    """Median seconds of ``step()`` over ``repeats`` runs (device synchronized)."""
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _train_step(module: torch.nn.Module, x: torch.Tensor) -> None:
    module(x).square().sum().backward()


def compiled_steps(device: torch.device, quick: bool) -> tuple[list[str], bool]:
    """Markdown rows: compiled (fullgraph) against eager training steps, and whether all outputs agree."""
    b, n, dim = (2, 256, 64) if quick else (8, 4096, 512)
    rows = ["| attention | eager ms | compiled ms | speed-up | max abs difference |", "|---|---|---|---|---|"]
    ok = True
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
        ok &= difference < 1e-3
        label = f"{name} causal" if causal else name
        rows.append(
            f"| {label} | {t_eager * 1e3:.1f} | {t_compiled * 1e3:.1f} | {t_eager / t_compiled:.2f}x | "
            f"{difference:.1e} |"
        )
    return rows, ok


def against_sdpa(device: torch.device, quick: bool) -> list[str]:
    """Markdown rows: forward+backward time and peak memory of RF attention against SDPA (B=8, H=8, Dh=64)."""
    b, h, dh = (1, 2, 16) if quick else (8, 8, 64)
    lengths = [256, 512] if quick else [4096, 8192, 16384, 32768, 65536]
    rows = ["| attention | N | ms | speed-up | peak MiB | memory |", "|---|---|---|---|---|---|"]
    for n in lengths:
        reference: tuple[float, float] | None = None
        for name in ["softmax", *KERNEL_PAIRS]:
            for causal in (False, True):
                q, k, v = (torch.randn(b, h, n, dh, device=device, requires_grad=True) for _ in range(3))
                if name == "softmax":
                    fm = None
                else:
                    component, matrix = name.rsplit("-", 1)
                    fm = rf_features.create(
                        component,
                        weight_matrix=matrix,
                        num_features=128,
                        dim=dh,
                        seed=0,
                        statistics_mode="running" if causal else "batch",
                    ).to(device)

                def step(fm: Any = fm, causal: bool = causal, q: Any = q, k: Any = k, v: Any = v) -> None:
                    if fm is None:
                        out = softmax_attention(q, k, v, causal=causal)
                    else:
                        out = rf_attention_fn(q, k, v, fm, causal=causal)
                    out.sum().backward()

                step()
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                    before = torch.cuda.memory_allocated(device)
                seconds = _seconds(step, device, 3)
                peak = (
                    (torch.cuda.max_memory_allocated(device) - before) / 2**20
                    if device.type == "cuda"
                    else 0.0
                )
                if name == "softmax" and not causal:
                    reference = (seconds, max(peak, 1e-9))
                assert reference is not None
                label = f"{name} causal" if causal else name
                rows.append(
                    f"| {label} | {n} | {seconds * 1e3:.1f} | {reference[0] / seconds:.2f}x | {peak:.0f} | "
                    f"{peak / reference[1]:.2f}x |"
                )
    return rows


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||`` in float64 on the CPU."""
    actual, expected = actual.detach().double().cpu(), expected.detach().double().cpu()
    scale = expected.norm()
    return float((actual - expected).norm() / scale) if scale > 0 else float(actual.norm())


def check_pair(name: str, causal: bool, dtype: torch.dtype, device: torch.device, n: int) -> dict:
    """Worst relative error of the output and the gradients of one ``<component>-<matrix>`` pair."""
    component, matrix = name.rsplit("-", 1)
    d, s = 16, 32
    fm = rf_features.create(
        component,
        weight_matrix=matrix,
        num_features=s,
        dim=d,
        seed=0,
        statistics_mode="running" if causal else "batch",
    ).eval()
    if hasattr(fm, "running_a"):
        fm.running_a.fill_(-0.05)
    reference_map = copy.deepcopy(fm).double()
    fm = fm.to(device)
    g = torch.Generator().manual_seed(0)
    q, k, v, w = (torch.randn(2, 2, n, d, generator=g, dtype=torch.float64) for _ in range(4))
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[1, n - n // 4 :] = True
    inputs = [t.to(device, dtype).requires_grad_() for t in (q, k, v)]
    masks = {"key_padding_mask": mask.to(device), "query_padding_mask": mask.to(device)}
    out = rf_attention_fn(*inputs, fm, causal=causal, **masks)
    params = list(fm.parameters())
    got = torch.autograd.grad((out.float() * w.to(device)).sum(), [*inputs, *params])
    # the reference sees the inputs as rounded to the tested dtype
    exact = [t.detach().cpu().double().requires_grad_() for t in inputs]
    ref_masks = {"key_padding_mask": mask, "query_padding_mask": mask}
    expected_out = naive_rf_attention(*exact, reference_map, causal=causal, **ref_masks)
    expected = torch.autograd.grad((expected_out * w).sum(), [*exact, *reference_map.parameters()])
    errors = [relative_error(out, expected_out)] + [
        relative_error(a, b) for a, b in zip(got, expected, strict=True)
    ]
    worst = max(errors)
    return {
        "check": f"{name} {'causal' if causal else 'noncausal'}",
        "dtype": str(dtype),
        "error": worst,
        "ok": worst < TOLERANCE[dtype] * (10 if component == "trigrf" else 1),
    }


def check_softmax(causal: bool, dtype: torch.dtype, device: torch.device, n: int) -> dict:
    """SDPA with key padding on the device against the naive softmax in float64."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, n, 16, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[0, n // 2 :] = True
    out = softmax_attention(*(t.to(device, dtype) for t in (q, k, v)), causal=causal, key_padding_mask=mask)
    exact = naive_softmax_attention(q, k, v, causal=causal, key_padding_mask=mask)
    error = relative_error(out, exact)
    return {
        "check": f"softmax {'causal' if causal else 'noncausal'}",
        "dtype": str(dtype),
        "error": error,
        "ok": error < TOLERANCE[dtype],
    }


def correctness(device: torch.device, quick: bool) -> list[dict]:
    """The sweep of part 1."""
    n = 24 if quick else 300  # not a multiple of the chunk sizes
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        for causal in (False, True):
            results.append(check_softmax(causal, dtype, device, n))
            for component in rf_features.names():
                for matrix in ("orf", "fastfoodl"):
                    results.append(check_pair(f"{component}-{matrix}", causal, dtype, device, n))
    return results


def run(command: list[str]) -> tuple[int, str]:
    """Run a benchmark script; its exit code and output."""
    print("$", " ".join(command), flush=True)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    return done.returncode, done.stdout + done.stderr[-4000:]


def main(argv: list[str] | None = None) -> None:
    """Run the parts not skipped and write ``report.md`` and ``correctness.json`` under ``--out``."""
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here; use --device cpu --quick for a CPU run")
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    report = [f"# GPU check on {name} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", ""]
    failed = False
    if "correctness" not in args.skip:
        results = correctness(device, args.quick)
        (args.out / "correctness.json").write_text(json.dumps(results, indent=1))
        bad = [r for r in results if not r["ok"]]
        failed |= bool(bad)
        report += [f"## Correctness: {len(results) - len(bad)}/{len(results)} within tolerance", ""]
        report += [f"- {r['check']} {r['dtype']}: relative error {r['error']:.2e}" for r in bad] or ["all ok"]
        report.append("")
    if "scaling" not in args.skip:
        lengths = args.lengths or ([256, 1024] if args.quick else [4096, 8192, 16384, 32768, 65536])
        attentions = [a for a in SCALING_ATTENTIONS if a != "performer-pytorch" or _has("performer_pytorch")]
        code, output = run(
            [
                sys.executable,
                str(HERE / "attention_scaling.py"),
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
        if (HERE / "decoding.py").exists():
            contexts = ["256", "1024"] if args.quick else ["1024", "4096", "16384", "65536"]
            code, output = run(
                [
                    sys.executable,
                    str(HERE / "decoding.py"),
                    "--contexts",
                    *contexts,
                    "--plot",
                    str(args.out / "decoding.png"),
                ]
            )
            failed |= code != 0
            report += ["## Decoding (the benchmark runs on the CPU: it has no device option)", "", output, ""]
        else:
            report += ["## Decoding", "", "benchmarks/decoding.py is not in this checkout; skipped.", ""]
    if "operations" not in args.skip:
        report += ["## Operations per training forward+backward (B = 1, dim 512, 8 heads)", ""]
        report += [*operations(device, args.quick), ""]
    if "compile" not in args.skip:
        rows, ok = compiled_steps(device, args.quick)
        failed |= not ok
        report += ["## torch.compile(fullgraph=True) training step against eager", "", *rows, ""]
    if "flash" not in args.skip:
        report += [
            "## Forward+backward against SDPA",
            "",
            "Speed-up: SDPA's time / the row's; memory: the row's peak / SDPA's (CUDA only).",
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
