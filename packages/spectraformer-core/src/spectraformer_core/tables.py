"""Plain-text Markdown tables, for demos, reports and benchmarks."""

from __future__ import annotations


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table with columns padded to equal width.

    Raises:
        ValueError: a row whose length differs from the header's.
    """
    for i, row in enumerate(rows):
        if len(row) != len(header):
            raise ValueError(f"rows[{i}]: expected {len(header)} cells like the header, got {len(row)}")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [header, ["-" * w for w in widths], *rows]
    return "\n".join(
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in lines
    )
