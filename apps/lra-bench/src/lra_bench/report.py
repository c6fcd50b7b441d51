"""``lra-bench report RESULTS``: the paper's Table 1, Table 7 and Table 8 layouts and Figure 4's heatmaps.

Every cell aggregates the runs of one (task, attention, features) over seeds: accuracy as
``mean (std)`` in percent (sample standard deviation, 0 for one seed), training time and peak memory as
means. ``mu`` is the mean over the tasks the row has results for (the paper's rows have all five).

- Table 1: one row per attention at one feature count (`table1_features`), sorted by mean accuracy.
- Table 7: one row per ``"<component>-<matrix>"`` attention and feature count.
- Table 8: per feature count, the mean over weight matrices of each component function (type ``f``)
  and the mean over component functions of each weight matrix (type ``W``).
- Figure 4: per feature count, one heatmap per task of mean accuracy, component x weight matrix.

``lra-bench curves PARTIAL``: the validation curves of unfinished runs (``lra-bench evaluate``'s records)
against Table 1's ListOps accuracy.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import lra_data
import rf_attention
from app_common.plots import pyplot, save_figure
from app_common.records import flat_record, report_folder
from app_common.results import mean_and_std, read_jsonl, write_table
from lra_bench.config import ReportConfig

TASK_LETTERS = {"listops": "L", "text": "T", "retrieval": "R", "image": "I", "pathfinder": "P"}
TIME_UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0}
GIB = 2**30


@dataclass(frozen=True)
class Cell:
    """One (task, attention, features) aggregated over seeds."""

    accuracy: float  # percent
    accuracy_std: float
    time_s: float
    memory_bytes: float
    seeds: int


def aggregate(records: list[dict]) -> dict[tuple[str, str, int], Cell]:
    """``(task, attention, features) -> Cell`` over the records' seeds (a repeated seed counts again)."""
    groups: dict[tuple[str, str, int], list[dict]] = defaultdict(list)
    for record in records:
        groups[(record["task"], record["attention"], int(record["features"]))].append(record)
    cells = {}
    for key, runs in groups.items():
        accuracy, accuracy_std = mean_and_std([100.0 * r["test_accuracy"] for r in runs])
        cells[key] = Cell(
            accuracy=accuracy,
            accuracy_std=accuracy_std,
            time_s=statistics.fmean(r["train_seconds"] for r in runs),
            memory_bytes=statistics.fmean(r["peak_memory_bytes"] for r in runs),
            seeds=len(runs),
        )
    return cells


def _tasks(cells) -> list[str]:
    present = {task for task, _, _ in cells}
    return [t for t in lra_data.TASKS if t in present]


def _mean(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.fmean(values) if values else math.nan


def _fmt(value: float, digits: int = 2) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def _metric_header(tasks: list[str], unit: str) -> list[str]:
    letters = [TASK_LETTERS[t] for t in tasks] + ["mu"]
    return (
        [f"Acc {x} (%)" for x in letters]
        + [f"Time {x} ({unit})" for x in letters]
        + [f"Mem {x} (GiB)" for x in letters]
    )


def _metric_row(
    cells: dict, tasks: list[str], attention: str, features: int, unit: str, std: bool
) -> tuple[float, list[str]]:
    """Accuracy, time and memory columns of one row; returns (mean accuracy, cells)."""
    found = [cells.get((t, attention, features)) for t in tasks]
    acc = [c.accuracy if c else math.nan for c in found]
    time = [c.time_s / TIME_UNITS[unit] if c else math.nan for c in found]
    mem = [c.memory_bytes / GIB if c else math.nan for c in found]
    acc_text = [
        "-" if c is None else (f"{c.accuracy:.2f} ({c.accuracy_std:.2f})" if std else f"{c.accuracy:.2f}")
        for c in found
    ]
    digits = 2 if unit == "h" else 1
    mu = _mean(acc)
    row = [
        *acc_text,
        _fmt(mu),
        *(_fmt(v, digits) for v in time),
        _fmt(_mean(time), digits),
        *(_fmt(v, 3) for v in mem),
        _fmt(_mean(mem), 3),
    ]
    return mu, row


def table1(cells: dict, features: int, unit: str = "h") -> tuple[list[str], list[list[str]]]:
    """Table 1: every attention with results at ``features``, sorted by mean accuracy (descending)."""
    tasks = _tasks(cells)
    attentions = sorted({a for _, a, f in cells if f == features})
    rows = [(_metric_row(cells, tasks, a, features, unit, std=True), a) for a in attentions]
    rows.sort(key=lambda item: -item[0][0] if not math.isnan(item[0][0]) else math.inf)
    return ["Model", *_metric_header(tasks, unit)], [[a, *row] for (_, row), a in rows]


def _pairs(cells: dict) -> dict[str, tuple[str, str]]:
    """Attention name -> (component, matrix) for the ``"<component>-<matrix>"`` attentions."""
    pairs = {}
    for _, attention, _ in cells:
        pair = rf_attention.split_pair(attention)
        if pair is not None:
            pairs[attention] = pair
    return pairs


def table7(cells: dict, unit: str = "h") -> tuple[list[str], list[list[str]]]:
    """Table 7: every ``"<component>-<matrix>"`` attention at every feature count it was run with."""
    tasks = _tasks(cells)
    pairs = _pairs(cells)
    rows = []
    for attention in sorted(pairs, key=lambda a: pairs[a]):
        for features in sorted({f for _, a, f in cells if a == attention}):
            _, row = _metric_row(cells, tasks, attention, features, unit, std=True)
            rows.append([attention, str(features), *row])
    return ["Model variant", "d", *_metric_header(tasks, unit)], rows


def table8(cells: dict, unit: str = "h") -> tuple[list[str], list[list[str]]]:
    """Table 8: means over weight matrices per component (``f``) and over components per matrix (``W``)."""
    tasks = _tasks(cells)
    pairs = _pairs(cells)
    rows = []
    for kind, position in (("f", 0), ("W", 1)):
        for part in sorted({p[position] for p in pairs.values()}):
            members = [a for a, p in pairs.items() if p[position] == part]
            for features in sorted({f for _, a, f in cells if a in members}):
                per_task = {
                    t: [cells[(t, a, features)] for a in members if (t, a, features) in cells] for t in tasks
                }
                acc = [_mean([c.accuracy for c in per_task[t]]) for t in tasks]
                time = [_mean([c.time_s / TIME_UNITS[unit] for c in per_task[t]]) for t in tasks]
                mem = [_mean([c.memory_bytes / GIB for c in per_task[t]]) for t in tasks]
                digits = 2 if unit == "h" else 1
                rows.append(
                    [
                        kind,
                        part,
                        str(features),
                        *(_fmt(v) for v in acc),
                        _fmt(_mean(acc)),
                        *(_fmt(v, digits) for v in time),
                        _fmt(_mean(time), digits),
                        *(_fmt(v, 3) for v in mem),
                        _fmt(_mean(mem), 3),
                    ]
                )
    return ["Type", "Method", "Features", *_metric_header(tasks, unit)], rows


def heatmaps(cells: dict, out: Path) -> list[Path]:
    """Figure 4: per feature count a PNG with one heatmap per task (mean test accuracy, %).

    Rows are component functions, columns weight matrices; cells without results are blank. Each panel
    has its own colour range (the paper fixes 20-40 for 10-class and 50-85 for 2-class tasks, which
    would wash out short runs).
    """
    import numpy as np

    plt = pyplot()
    pairs = _pairs(cells)
    if not pairs:
        return []
    tasks = _tasks(cells)
    components = sorted({c for c, _ in pairs.values()})
    matrices = sorted({m for _, m in pairs.values()})
    paths = []
    for features in sorted({f for _, a, f in cells if a in pairs}):
        width = max(4.5, 1.8 + 0.8 * len(matrices))
        height = max(3.0, 1.6 + 0.5 * len(components))
        figure, axes = plt.subplots(1, len(tasks), figsize=(width * len(tasks), height), squeeze=False)
        for ax, task in zip(axes[0], tasks, strict=True):
            grid = np.full((len(components), len(matrices)), np.nan)
            for attention, (component, matrix) in pairs.items():
                cell = cells.get((task, attention, features))
                if cell is not None:
                    grid[components.index(component), matrices.index(matrix)] = cell.accuracy
            image = ax.imshow(grid, cmap="viridis", aspect="auto")
            ax.set_xticks(range(len(matrices)), matrices, rotation=45, ha="right")
            ax.set_yticks(range(len(components)), components)
            ax.set_title(f"{TASK_LETTERS[task]} ({task})")
            for i in range(len(components)):
                for j in range(len(matrices)):
                    if not np.isnan(grid[i, j]):
                        ax.text(j, i, f"{grid[i, j]:.1f}", ha="center", va="center", color="w", fontsize=8)
            figure.colorbar(image, ax=ax, shrink=0.8)
        figure.suptitle(f"Test accuracy (%), {features} features")
        paths.append(save_figure(figure, out / f"figure4_f{features}.png", dpi=120))
    return paths


#: Table 1's ListOps column: test accuracy (%), mean and standard deviation over five seeds, by attention.
PAPER_LISTOPS = {"softmax": (38.49, 0.80), "oprf-fastfoodl": (37.73, 0.28), "performer": (34.50, 6.49)}


def learning_curves(records: list[dict], path: Path) -> Path:
    """Validation accuracy (%) against the step of each run, beside Table 1's ListOps accuracy.

    ``records``: ``lra-bench evaluate`` lines (``attention``, ``curve`` of ``[step, accuracy]``,
    ``test_accuracy`` of the best weights so far, ``best_step``); the last line of a run wins. Each run is
    a line with its test accuracy so far as a marker at its best step; the paper's mean +- std for the
    same attention is a band. Writes ``path`` (PNG) and returns it.
    """
    plt = pyplot()

    latest = {r["run"]: r for r in records}
    figure, ax = plt.subplots(figsize=(7, 4.2))
    for index, record in enumerate(latest.values()):
        colour = f"C{index}"
        steps, accuracies = zip(*record["curve"], strict=True) if record["curve"] else ((), ())
        ax.plot(
            steps,
            [100 * a for a in accuracies],
            "o-",
            ms=3,
            color=colour,
            label=f"{record['attention']}: validation",
        )
        ax.plot(
            record["best_step"],
            100 * record["test_accuracy"],
            "o",
            color=colour,
            label=f"{record['attention']}: test at the best step so far",
        )
        if record["attention"] in PAPER_LISTOPS and record["task"] == "listops":
            mean, std = PAPER_LISTOPS[record["attention"]]
            ax.axhspan(mean - std, mean + std, color=colour, alpha=0.15)
            ax.axhline(mean, color=colour, linestyle="--", linewidth=1, label=f"paper (Table 1) {mean:.2f}")
    ax.set_xlabel("step")
    ax.set_ylabel("accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(figure, path, dpi=120)


#: The attention features of the paper's Table 1.
PAPER_FEATURES = 128


def table1_features(cells: dict, wanted: int | None = None) -> int:
    """The feature count of Table 1: ``wanted``, else 128 when the results have it, else their largest."""
    if wanted is not None:
        return wanted
    counts = {f for _, _, f in cells}
    return PAPER_FEATURES if PAPER_FEATURES in counts or not counts else max(counts)


def _write(out: Path, stem: str, header: list[str], rows: list[list[str]]) -> str:
    text = write_table(out / stem, header, rows)
    if not rows:
        text = f"(no rows: {stem} needs results of matching attentions)"
        (out / f"{stem}.md").write_text(text + "\n", encoding="utf-8")
    return text


def report(config: ReportConfig) -> dict[str, str]:
    """Write Tables 1, 7, 8 (``.md``, ``.csv``) and ``figure4_f*.png``; returns each table's Markdown.

    The files go to ``config.report_dir`` (default: ``report/`` beside the results file).

    Raises:
        FileNotFoundError: no results file.
        ValueError: no records in it, or a record missing a field, naming the line.
    """
    records = [flat_record(r) for r in read_jsonl(config.results)]
    if not records:
        raise ValueError(f"{config.results}: no results yet")
    needed = ("task", "attention", "features", "test_accuracy", "train_seconds", "peak_memory_bytes")
    for number, record in enumerate(records, start=1):
        missing = [k for k in needed if k not in record]
        if missing:
            raise ValueError(f"{config.results}: record {number} lacks {', '.join(missing)}")
    if config.time_unit not in TIME_UNITS:
        raise ValueError(f"time_unit: expected one of {', '.join(TIME_UNITS)}, got {config.time_unit!r}")
    out = report_folder(config.results, config.report_dir)
    out.mkdir(parents=True, exist_ok=True)
    cells = aggregate(records)
    tables = {
        "table1": table1(cells, table1_features(cells, config.table1_features), config.time_unit),
        "table7": table7(cells, config.time_unit),
        "table8": table8(cells, config.time_unit),
    }
    texts = {stem: _write(out, stem, *table) for stem, table in tables.items()}
    heatmaps(cells, out)
    return texts
