"""GPU check: rf-attention against its float64 references on the device, then speed, memory and decoding.

Three parts, one command, a Markdown report under ``--out``:

1. correctness: every component with an unstructured and a learnable matrix, causal and not, with key
   padding, in float32 and bfloat16 on the device: outputs and gradients (``dq, dk, dv`` and the matrix
   parameters) against ``rf_attention.naive`` in float64 on the CPU, same feature map; softmax likewise;
2. scaling: ``attention_scaling.py --device <device>`` (fresh process per point; on CUDA the peak is
   ``torch.cuda.max_memory_allocated``), 4K to 64K against SDPA (flash/memory-efficient kernels);
3. decoding: ``decoding.py`` (per-token latency against the context), when that benchmark is present.

    python benchmarks/gpu_check.py                          # on a CUDA machine
    python benchmarks/gpu_check.py --device cpu --quick     # the same code paths on the CPU, small sizes
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

import rf_features
from rf_attention import rf_attention, softmax_attention
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
    parser.add_argument("--quick", action="store_true", help="small sizes (a CPU smoke run)")
    parser.add_argument("--lengths", type=int, nargs="+", default=None, help="scaling lengths")
    parser.add_argument("--out", type=Path, default=Path("results/gpu_check"))
    parser.add_argument("--skip", nargs="*", default=[], choices=["correctness", "scaling", "decoding"])
    return parser.parse_args(argv)


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
    out = rf_attention(*inputs, fm, causal=causal, **masks)
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
    (args.out / "report.md").write_text("\n".join(report))
    print("\n".join(report))
    if failed:
        raise SystemExit(1)


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    main()
