"""Plain-text reporting shared by the packages' demo commands."""

from __future__ import annotations

import time

from spectraformer_core import markdown_table


def print_report(title: str, header: list[str], rows: list[list[str]], started: float) -> None:
    """Print ``title``, the Markdown table and the seconds since ``started`` (``time.perf_counter``)."""
    print(f"{title}\n")
    print(markdown_table(header, rows))
    print(f"\n{time.perf_counter() - started:.1f} s")
