"""Results as JSON lines, and result tables as Markdown and CSV.

A JSON-lines file holds one self-contained record per finished run, appended, never rewritten.
"""

from __future__ import annotations

import csv
import fcntl
import json
import math
import os
import statistics
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from spectraformer_core import markdown_table

__all__ = [
    "append_jsonl",
    "iter_jsonl",
    "markdown_table",
    "mean_and_std",
    "read_jsonl",
    "write_csv",
    "write_table",
]


def _default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item):  # 0-d tensors and numpy scalars
        return value.item()
    raise TypeError(f"record: {type(value).__name__} value {value!r:.60} is not JSON serializable")


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append ``record`` as one line of JSON to ``path`` (created with its folders if missing).

    The line is written with one ``write`` under an exclusive ``flock``, so processes sharing the file
    (a sweep's shards on one machine) never interleave lines.

    Raises:
        TypeError: a value that is not JSON serializable (paths, tensors and numpy scalars are converted).
    """
    line = json.dumps(record, default=_default, sort_keys=False) + "\n"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def iter_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """The records of a JSON-lines file, in order; blank lines are skipped.

    A last line without its newline that does not parse (a writer killed mid-line) is skipped too.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: a line that is not a JSON object, naming the file and line number.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such results file")
    lines = path.read_text(encoding="utf-8").split("\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):  # the torn tail of an interrupted append
                return
            raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        yield record


def read_jsonl(path: str | Path, *, missing_ok: bool = False) -> list[dict[str, Any]]:
    """All records of a JSON-lines file (see `iter_jsonl`); ``missing_ok``: [] for no file."""
    if missing_ok and not Path(path).is_file():
        return []
    return list(iter_jsonl(path))


def write_table(stem: str | Path, header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Write ``stem.md`` (a Markdown table) and ``stem.csv`` (the same cells); returns the Markdown.

    Cells are written as ``str(cell)`` in the Markdown and as they are in the CSV (full precision for
    numbers: format the Markdown's cells yourself where they need rounding, e.g. by passing strings).
    """
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    text = markdown_table([str(h) for h in header], [[str(c) for c in row] for row in rows])
    stem.with_suffix(".md").write_text(text + "\n", encoding="utf-8")
    write_csv(stem.with_suffix(".csv"), header, rows)
    return text


def mean_and_std(values: Sequence[float]) -> tuple[float, float]:
    """The mean and spread of one result over seeds: ``(mean, sample standard deviation)``.

    The standard deviation divides by ``n - 1`` (``statistics.stdev``) and is 0 for a single seed; no
    values give ``(nan, 0.0)``. Both are the standard library's, so a repeated seed counts again.
    """
    mean = statistics.fmean(values) if values else math.nan
    return mean, statistics.stdev(values) if len(values) > 1 else 0.0


def write_csv(path: str | Path, header: Sequence[object], rows: Iterable[Sequence[object]]) -> Path:
    """Write a CSV file (UTF-8, the header row first, cells as they are); returns the path.

    For a CSV whose columns differ from its Markdown table's (a long format at full precision);
    [`write_table`][app_common.results.write_table] writes both from the same cells.
    """
    path = Path(path)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path
