"""Triton check: rf-attention's Triton kernels against its PyTorch path, flash SDPA and materialized features.

One command for a CUDA machine, sized for a 10-minute call; a JSON and a Markdown report under ``--out``:

1. tests: rf-attention's Triton tests on the device (``test_triton.py``: every family, causal and not,
   outputs and gradients against the float64 PyTorch path; ``test_triton_compile.py``: the kernels
   compiled ahead of time for sm_80/sm_90, shared memory within the device's);
2. training: forward+backward at ``B = 8, H = 8, Dh = 64``, 128 features, N = 4K to 64K, causal and not,
   bfloat16 inputs: ``rf_attention(..., backend="triton")``, ``backend="torch"``, SDPA (flash, causal
   with ``is_causal=True``) and fla-style materialized features (the features computed in PyTorch, then a
   chunked linear-attention product: fla's ``chunk_linear_attn`` where ``fla`` imports, else
   ``rf_attention.linear_attention``);
3. decoding: one token against a context of N (the Triton fused step, the PyTorch step of
   ``rf_attention.ops.recurrent.decode``, SDPA over the KV cache).

Points left when ``--budget`` seconds have passed are reported as skipped (the call's limit is kept).

    python -m spectraformer_benchmarks.triton_check        # on a CUDA machine: the prepared command
    python -m spectraformer_benchmarks.triton_check --lengths 4096 --pairs posrf-orf --skip tests

(as ``uv run --frozen --package spectraformer-benchmarks python -m ...``, from the repository root)
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import rf_attention
import rf_features
from app_common.measure import median_seconds
from rf_attention.ops.features import ClosedForm, qk_scale
from rf_attention.ops.recurrent import decode

PARTS = ["tests", "training", "decoding"]
TEST_FILES = [
    "packages/rf-attention/tests/test_triton.py",
    "packages/rf-attention/tests/test_triton_compile.py",
]
METHODS = ["sdpa", "triton", "torch", "materialized"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--help`` lists them)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768, 65536])
    parser.add_argument("--pairs", nargs="+", default=["posrf-orf", "trigrf-sorf"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--features", type=int, default=128, help="rows of the weight matrix")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=float, default=480.0, help="seconds after which points are skipped")
    parser.add_argument("--out", type=Path, default=Path("results/triton_check"))
    parser.add_argument("--skip", nargs="*", default=[], choices=PARTS)
    args = parser.parse_args(argv)
    for name in args.pairs:
        if rf_attention.split_pair(name) is None:
            parser.error(f"--pairs: {name!r} is not a '<component>-<matrix>' pair")
    if min(args.lengths) < 1 or args.repeats < 1:
        parser.error(f"--lengths and --repeats: expected positive, got {args.lengths} and {args.repeats}")
    return args


def feature_map(
    pair: str, args: argparse.Namespace, causal: bool, device: torch.device
) -> rf_features.FeatureMap:
    """The pair's map on ``device`` (running statistics when causal)."""
    component, matrix = rf_attention.split_pair(pair)  # type: ignore[misc]  # checked by parse_args
    return rf_features.create(
        component,
        weight_matrix=matrix,
        num_features=args.features,
        dim=args.head_dim,
        seed=0,
        statistics_mode="running" if causal else "batch",
    ).to(device)


def materialized(fm: rf_features.FeatureMap, causal: bool) -> Callable[..., torch.Tensor]:
    """Features computed in PyTorch, then a chunked linear-attention product (fla's where it imports)."""
    if importlib.util.find_spec("fla") is not None:
        from fla.ops.linear_attn import chunk_linear_attn

        def fla_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            scale = qk_scale(q.shape[-1])
            phi_q, phi_k = fm(q.float() * scale, k.float() * scale, stabilize=True)
            out = chunk_linear_attn(
                phi_q.to(q.dtype).transpose(1, 2),
                phi_k.to(q.dtype).transpose(1, 2),
                v.transpose(1, 2),
                scale=1.0,
                normalize=True,
            )[0]
            return out.transpose(1, 2)

        return fla_attention

    def ours(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scale = qk_scale(q.shape[-1])
        phi_q, phi_k, key_scale = fm.forward_with_key_scales(q.float() * scale, k.float() * scale)
        return rf_attention.linear_attention(phi_q, phi_k, v, causal=causal, key_log_scale=key_scale)

    return ours


def training_step(
    method: str, pair: str, n: int, causal: bool, args: argparse.Namespace, device: torch.device
) -> Callable[[], None]:
    """One forward+backward of ``method`` on fresh bfloat16 ``q, k, v (B, H, n, Dh)``."""
    shape = (args.batch, args.heads, n, args.head_dim)
    q, k, v = (torch.randn(shape, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    if method == "sdpa":
        attend: Callable[..., torch.Tensor] = lambda q, k, v: rf_attention.softmax_attention(  # noqa: E731
            q, k, v, causal=causal
        )
    else:
        fm = feature_map(pair, args, causal, device)
        if method == "materialized":
            attend = materialized(fm, causal)
        else:
            attend = lambda q, k, v: rf_attention.rf_attention(  # noqa: E731
                q, k, v, fm, causal=causal, backend=method
            )
    return lambda: attend(q, k, v).float().sum().backward()


def decode_step(
    method: str, pair: str, n: int, args: argparse.Namespace, device: torch.device
) -> Callable[[], Any]:
    """One decoding step against a context of ``n`` tokens (its state or KV cache built from random keys)."""
    b, h, dh = args.batch, args.heads, args.head_dim
    q, k, v = (torch.randn(b, h, 1, dh, device=device) for _ in range(3))
    if method == "sdpa":
        keys, values = (torch.randn(b, h, n, dh, device=device, dtype=torch.bfloat16) for _ in range(2))
        return lambda: torch.nn.functional.scaled_dot_product_attention(q.bfloat16(), keys, values)
    fm = feature_map(pair, args, True, device).eval()
    context = [torch.randn(b, h, min(n, 4096), dh, device=device) for _ in range(3)]
    with torch.no_grad():
        _, state = decode(*context, fm, None)
    if method == "torch":
        return lambda: decode(q, k, v, fm, state)
    from rf_attention.ops.triton.fused_recurrent import fused_recurrent_step

    scale = qk_scale(dh)
    closed = ClosedForm.of(fm.contract(q, k, scale=scale, dtype=torch.float32), q.shape[:-2], torch.float32)
    eps = torch.finfo(torch.float32).eps
    return lambda: fused_recurrent_step(
        q, k, v, None, closed, state.sums, state.log_scale, state.magnitude, eps
    )


def run_tests() -> dict[str, Any]:
    """rf-attention's Triton tests on this machine's device: exit code and the summary line."""
    command = [sys.executable, "-m", "pytest", *TEST_FILES, "-q", "-p", "no:xdist", "-x"]
    print("$", " ".join(command), flush=True)
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return {"exit_code": done.returncode, "summary": lines[-1] if lines else ""}


def measure(
    build: Callable[[], Callable[[], Any]], device: torch.device, repeats: int
) -> dict[str, float | str]:
    """Median milliseconds of the built step (after one warm-up run), or the error it raised."""
    try:
        step = build()
        step()
        return {"ms": median_seconds(step, repeats=repeats, warmup=0, device=device) * 1e3}
    except (RuntimeError, ValueError, ImportError) as error:  # out of memory, a refused backend, no fla
        return {"error": f"{type(error).__name__}: {str(error)[:200]}"}
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()


def markdown(results: dict[str, Any]) -> list[str]:
    """The report's tables: milliseconds per method, and the Triton kernels' speed-ups."""

    def cell(entry: dict[str, Any]) -> str:
        return f"{entry['ms']:.2f}" if "ms" in entry else ("skipped" if entry.get("skipped") else "error")

    lines = [f"# Triton check on {results['device']} ({results['date']})", ""]
    if "tests" in results:
        lines += [f"Tests: exit code {results['tests']['exit_code']}, {results['tests']['summary']}", ""]
    for part in ("training", "decoding"):
        rows = results.get(part, [])
        if not rows:
            continue
        methods = [m for m in METHODS if m in rows[0]]
        lines += [f"## {part.capitalize()} (ms)", "", "| pair | causal | N | " + " | ".join(methods) + " |"]
        lines.append("|---|---|---|" + "---|" * len(methods))
        for row in rows:
            cells = " | ".join(cell(row[m]) for m in methods)
            lines.append(f"| {row['pair']} | {row['causal']} | {row['n']} | {cells} |")
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> None:
    """Run the parts not skipped; write ``triton_check.json`` and ``triton_check.md`` under ``--out``."""
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type != "cuda" or not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: the Triton check needs a CUDA device, and none is here")
    start = time.monotonic()
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "shape": {"B": args.batch, "H": args.heads, "Dh": args.head_dim, "features": args.features},
    }
    if "tests" not in args.skip:
        results["tests"] = run_tests()

    def timed(build: Callable[[], Callable[[], Any]]) -> dict[str, Any]:
        if time.monotonic() - start > args.budget:
            return {"skipped": True}
        return measure(build, device, args.repeats)

    for part in ("training", "decoding"):
        if part in args.skip:
            continue
        rows = []
        for pair in args.pairs:
            for causal in (False, True) if part == "training" else (True,):
                for n in args.lengths:
                    row: dict[str, Any] = {"pair": pair, "causal": causal, "n": n}
                    for method in METHODS if part == "training" else ["sdpa", "triton", "torch"]:
                        if part == "training":
                            build = functools.partial(training_step, method, pair, n, causal, args, device)
                        else:
                            build = functools.partial(decode_step, method, pair, n, args, device)
                        row[method] = timed(build)
                        print(part, pair, causal, n, method, row[method], flush=True)
                    rows.append(row)
        results[part] = rows
    results["seconds"] = time.monotonic() - start
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "triton_check.json").write_text(json.dumps(results, indent=1))
    report = "\n".join(markdown(results))
    (args.out / "triton_check.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
