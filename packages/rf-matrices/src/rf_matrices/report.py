"""Plain-text reporting shared by the packages' demo commands."""

from __future__ import annotations

import time

import torch


def demo_device(name: str) -> torch.device:
    """``"auto"`` (CUDA when available, else CPU), ``"cpu"`` or ``"cuda[:i]"`` as a device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def print_report(title: str, header: list[str], rows: list[list[str]], started: float) -> None:
    """Print ``title``, the Markdown table and the seconds since ``started`` (``time.perf_counter``)."""
    print(f"{title}\n")
    print(markdown_table(header, rows))
    print(f"\n{time.perf_counter() - started:.1f} s")


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table with columns padded to equal width."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [header, ["-" * w for w in widths], *rows]
    return "\n".join(
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in lines
    )
