"""Plain-text reporting shared by the packages' demo commands."""

from __future__ import annotations


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table with columns padded to equal width."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [header, ["-" * w for w in widths], *rows]
    return "\n".join(
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in lines
    )
