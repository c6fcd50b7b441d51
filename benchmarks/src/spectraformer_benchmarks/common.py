"""What the benchmarks share: pair lists, the machine, fresh measuring processes and their environment."""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence

import torch

import rf_attention
from app_common.device import device_name
from app_common.measure import MMAP_THRESHOLD_BYTES, median_seconds


def rf_pairs() -> list[str]:
    """Every ``"<component>-<matrix>"`` name of ``rf_attention.names()`` (the baselines left out)."""
    return [name for name in rf_attention.names() if rf_attention.split_pair(name) is not None]


def expand_pairs(names: Sequence[str], keyword: str = "pairs") -> list[str]:
    """``names`` with ``keyword`` replaced by every random-feature pair, duplicates dropped."""
    expanded: list[str] = []
    for name in names:
        expanded += rf_pairs() if name == keyword else [name]
    return list(dict.fromkeys(expanded))


def parse_repeats_at(text: str) -> tuple[int, int]:
    """``"N=R"`` -> ``(N, R)``: ``R`` timed runs at length ``N``."""
    try:
        n, repeats = (int(part) for part in text.split("="))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--repeats-at: expected N=R (two integers), got {text!r}") from None
    if repeats < 0:
        raise argparse.ArgumentTypeError(f"--repeats-at: expected R >= 0 repeats, got {text!r}")
    return n, repeats


def add_repeats_arguments(parser: argparse.ArgumentParser, default: int, help: str) -> None:
    """``--repeats`` (``default``, described by ``help``) and ``--repeats-at N=R`` (repeatable)."""
    parser.add_argument("--repeats", type=int, default=default, help=help)
    parser.add_argument(
        "--repeats-at",
        type=parse_repeats_at,
        action="append",
        default=[],
        metavar="N=R",
        help="R timed runs at length N instead of --repeats (repeatable)",
    )


def repeats_at(n: int, args: argparse.Namespace) -> int:
    """Timed runs at length ``n``: ``--repeats-at`` if it names ``n``, else ``--repeats``."""
    return dict(args.repeats_at).get(n, args.repeats)


def machine(device: str = "cpu") -> str:
    """The device's name (``app_common.device.device_name``), cores, threads and library versions."""
    name = device_name(torch.device(device))
    if device.startswith("cuda"):
        return f"{name}, PyTorch {torch.__version__}, CUDA {torch.version.cuda}"
    return (
        f"{name}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, "
        f"PyTorch {torch.__version__}, Python {platform.python_version()}"
    )


def command_line() -> str:
    """The command that runs this process, as a user would type it (``python -m module args``)."""
    module = sys.modules["__main__"].__spec__
    program = f"-m {module.name}" if module is not None else sys.argv[0]
    return " ".join(["python", program, *sys.argv[1:]])


def matmul_rate(size: int = 2048, repeats: int = 5, device: torch.device | None = None) -> float:
    """Measured float32 matmul GFLOP/s of this machine (``size x size`` by ``size x size``)."""
    device = device or torch.device("cpu")
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    return 2 * size**3 / median_seconds(lambda: a @ b, repeats=repeats, device=device) / 1e9


#: What a measuring process measures: the peak memory of one forward+backward, or the time of several.
QUANTITIES = ("memory", "time")


def point_environment(quantity: str) -> dict[str, str]:
    """The environment of a process measuring ``quantity``: this one's (memory: the mmap threshold fixed).

    Memory: glibc's malloc mmap threshold at ``app_common.measure.MMAP_THRESHOLD_BYTES`` (128 KiB), so that
    the resident peak counts the tensors alive at once. Time: the allocator as users run it (with the
    threshold fixed, every block of 128 KiB or more is a fresh ``mmap`` whose pages fault in on first touch:
    that slows a kernel by how many large temporaries it allocates, not by its arithmetic).
    """
    if quantity not in QUANTITIES:
        raise ValueError(f"quantity: expected one of {QUANTITIES}, got {quantity!r}")
    if quantity == "time":
        return dict(os.environ)
    return {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES), **os.environ}


def run_json_lines(
    command: list[str], timeout: float, key: Callable[[dict], tuple], keys: Sequence[tuple], quantity: str
) -> list[dict]:
    """Run ``command`` in a fresh interpreter; its stdout's JSON lines, one per key of ``keys``, in order.

    The interpreter's environment is `point_environment` ``(quantity)``.

    Each line is echoed to stderr as it comes. The process is killed after ``timeout`` seconds; a key without
    a line gets ``{"error": reason}`` (the timeout, or the last line the process wrote to stderr).
    """
    measured: dict[tuple, dict] = {}
    with (
        tempfile.TemporaryFile("w+") as errors,
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=errors, text=True, env=point_environment(quantity)
        ) as process,
    ):
        timer = threading.Timer(timeout, process.kill)
        timer.start()
        for line in process.stdout or []:
            if line.strip():
                result = json.loads(line)
                measured[key(result)] = result
                print(line.strip(), file=sys.stderr, flush=True)
        process.wait()
        timer.cancel()
        errors.seek(0)
        last_error = errors.read().strip().splitlines()[-1:]
    if process.returncode == -signal.SIGKILL:
        last_error = [f"timeout after {timeout:.0f} s"]
    reason = last_error[0] if last_error and process.returncode else "no result"
    return [measured.get(k, {"error": reason}) for k in keys]


def k(n: int) -> str:
    """``8192`` -> ``"8K"``; lengths that are not a multiple of 1024 as they are."""
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)
