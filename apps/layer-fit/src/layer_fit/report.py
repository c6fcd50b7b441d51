"""``layer-fit report RESULTS``: train MSE as mean +/- std over seeds, per activation, method and budget.

Writes to the output folder:

- ``table.md`` / ``table.csv``: activation x method at one budget (Fig. 2, left), with the lowest method;
- ``floors.md`` / ``floors.csv``: beside the table, each method's information floor (the least MSE of any
  readout of its fixed random features) and the Eckart-Young floor of its width ``F``
  ([`layer_fit.floors`][layer_fit.floors]): a method near its floors is limited by its features, one far
  above them by its training;
- ``sweep.md`` / ``sweep.csv``: activation x method x budget (Fig. 2, right), when several budgets were run,
  and ``sweep_floors.md`` / ``.csv`` beside it;
- ``mse_bars.png``: grouped bars per activation at the budget, log scale, error bars one std;
- ``mse_vs_budget.png``: MSE against budget per activation, one line per method (several budgets only).

The standard deviation is the sample standard deviation over seeds (0 for one seed). Diverged runs (a
non-finite loss) are counted apart and left out of the mean, and so are runs that did not start (their
method raised at the start, or the first loss was not finite): a cell none of whose runs started reads
``does not start (reason)``, and the reasons are listed in full under the table.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from app_common.plots import pyplot, save_figure
from app_common.records import flat_record, report_folder
from app_common.results import markdown_table, mean_and_std, read_jsonl, write_csv, write_table
from layer_fit.config import ACTIVATIONS, PAPER_METHODS, FitConfig, ReportConfig, recorded_protocol

#: The record fields that make two runs comparable.
PROTOCOL_KEYS = tuple(FitConfig().full_protocol())
#: The longest reason a table cell shows (the full one is listed under the table).
REASON_WIDTH = 60


@dataclass(frozen=True)
class Cell:
    """The runs of one (activation, method, budget) aggregated over seeds."""

    mean: float
    std: float
    seeds: int
    diverged: int
    seconds: float
    information_floor: float | None = None
    eckart_young_floor: float | None = None
    feature_dim: int | None = None
    not_started: int = 0
    reason: str | None = None  # why the first run that did not start did not


def _ordered(values: set[str], preferred: tuple[str, ...]) -> list[str]:
    return [v for v in preferred if v in values] + sorted(values - set(preferred))


def aggregate(records: list[dict]) -> dict[tuple[str, str, int], Cell]:
    """``(activation, method, budget) -> Cell``.

    Raises:
        ValueError: no records, records of different protocols (steps, sizes, ...) in one file, or one
            run (activation, method, budget, seed) recorded twice.
    """
    if not records:
        raise ValueError("results: no records to report")
    protocols = {tuple(recorded_protocol(r, PROTOCOL_KEYS).items()) for r in records}
    if len(protocols) > 1:
        listed = "; ".join(", ".join(f"{k}={v}" for k, v in p) for p in sorted(protocols, key=str))
        raise ValueError(f"results: runs of {len(protocols)} different protocols in one file ({listed})")
    groups: dict[tuple[str, str, int], list[dict]] = defaultdict(list)
    seen: dict[tuple[str, str, int, int], str] = {}
    for record in records:
        key = (record["activation"], record["method"], int(record["budget"]))
        run = (*key, int(record["seed"]))
        if run in seen:
            raise ValueError(
                f"results: the run ({', '.join(map(str, run))}) is recorded twice (names {seen[run]!r} and "
                f"{record.get('name')!r}); keep one line of it"
            )
        seen[run] = str(record.get("name"))
        groups[key].append(record)
    cells = {}
    for key, group in groups.items():
        runs = [r for r in group if not r.get("not_started")]
        idle = [r["not_started"] for r in group if r.get("not_started")]
        ok = [r["mse"] for r in runs if not r.get("diverged") and r.get("mse") is not None]
        mean, std = mean_and_std(ok)
        cells[key] = Cell(
            mean=mean,
            std=std,
            seeds=len(ok),
            diverged=len(runs) - len(ok),
            seconds=statistics.fmean(r["train_seconds"] for r in runs) if runs else 0.0,
            information_floor=_mean_of(runs, "information_floor"),
            eckart_young_floor=_mean_of(runs, "eckart_young_floor"),
            feature_dim=runs[0].get("feature_dim") if runs else None,
            not_started=len(idle),
            reason=idle[0] if idle else None,
        )
    return cells


def _mean_of(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.fmean(values) if values else None


def _fmt(cell: Cell | None) -> str:
    if cell is None:
        return "-"
    if cell.reason is not None and not cell.seeds and not cell.diverged:
        return f"does not start ({_reason_cell(cell.reason)})"
    text = "diverged" if math.isnan(cell.mean) else f"{cell.mean:.3e} ± {cell.std:.1e}"
    width = "" if cell.feature_dim is None else f" [F={cell.feature_dim}]"
    idle = f" ({cell.not_started} did not start)" if cell.not_started else ""
    return text + width + (f" ({cell.diverged} diverged)" if cell.diverged else "") + idle


def _reason_cell(reason: str) -> str:
    """``reason`` cut to `REASON_WIDTH` characters for a table cell, its ``|`` escaped."""
    cut = reason if len(reason) <= REASON_WIDTH else reason[: REASON_WIDTH - 1] + "…"
    return cut.replace("|", "\\|")


def not_started_lines(cells: dict, budget: int) -> list[str]:
    """One line per cell at ``budget`` with runs that did not start: how many, and the first one's reason."""
    return [
        f"does not start: {a} / {m} / B={b}, {c.not_started} run(s): {c.reason}"
        for (a, m, b), c in sorted(cells.items())
        if b == budget and c.reason is not None
    ]


def _axes(cells: dict) -> tuple[list[str], list[str], list[int]]:
    activations = _ordered({a for a, _, _ in cells}, ACTIVATIONS)
    methods = _ordered({m for _, m, _ in cells}, PAPER_METHODS)
    budgets = sorted({b for _, _, b in cells})
    return activations, methods, budgets


def lowest(cells: dict, activation: str, budget: int) -> str | None:
    """The method with the lowest mean MSE for ``activation`` at ``budget`` (None if none finished)."""
    found = {m: c.mean for (a, m, b), c in cells.items() if a == activation and b == budget}
    found = {m: v for m, v in found.items() if not math.isnan(v)}
    return min(found, key=found.get) if found else None


def main_table(cells: dict, budget: int) -> tuple[list[str], list[list[str]]]:
    """Activation x method at ``budget``: ``mean ± std`` of the train MSE, and the lowest method."""
    activations, methods, _ = _axes(cells)
    header = ["activation", *methods, "lowest", "seeds"]
    rows = []
    for activation in activations:
        if not any((activation, m, budget) in cells for m in methods):
            continue
        seeds = sorted(
            {cells[(activation, m, budget)].seeds for m in methods if (activation, m, budget) in cells}
        )
        rows.append(
            [
                activation,
                *(_fmt(cells.get((activation, m, budget))) for m in methods),
                lowest(cells, activation, budget) or "-",
                "/".join(map(str, seeds)),
            ]
        )
    return header, rows


def _compact(cell: Cell | None) -> str:
    """``mean ± std (seeds)`` to 3 digits (no spread for one seed), the diverged runs counted; ``-``: none."""
    if cell is None:
        return "-"
    if cell.reason is not None and not cell.seeds and not cell.diverged:
        return "does not start"
    if math.isnan(cell.mean):
        return f"diverged ({cell.diverged})"
    spread = f" ± {cell.std:.2g}" if cell.seeds > 1 else ""
    text = f"{cell.mean:.3g}{spread} ({cell.seeds})"
    return text + (f", {cell.diverged} diverged" if cell.diverged else "")


def method_table(cells: dict, budget: int) -> tuple[list[str], list[list[str]]]:
    """Method x activation at ``budget``, compact: ``mean ± std (seeds)`` of the train MSE per cell."""
    activations, methods, _ = _axes(cells)
    header = ["method", *activations]
    rows = [
        [method, *(_compact(cells.get((a, method, budget))) for a in activations)]
        for method in methods
        if any((a, method, budget) in cells for a in activations)
    ]
    return header, rows


def floors_table(cells: dict, budget: int) -> tuple[list[str], list[list[str]]]:
    """Activation x method at ``budget``: ``information floor / Eckart-Young floor (F)`` beside the MSE table.

    ``-``: a method without fixed features (LowRank, linear), which neither floor bounds.
    """
    activations, methods, _ = _axes(cells)
    header = ["activation", *methods]
    rows = []
    for activation in activations:
        found = [cells.get((activation, m, budget)) for m in methods]
        if not any(found):
            continue

        def cell(c: Cell | None) -> str:
            if c is None or c.information_floor is None:
                return "-"
            return f"{c.information_floor:.3e} / {c.eckart_young_floor:.3e} (F={c.feature_dim})"

        rows.append([activation, *(cell(c) for c in found)])
    return header, rows


def floor_lines(cells: dict, budget: int) -> list[str]:
    """For each method with fixed features: how far its mean MSE is above its information floor."""
    _, methods, _ = _axes(cells)
    lines = []
    for method in methods:
        ratios = [
            c.mean / c.information_floor
            for (a, m, b), c in cells.items()
            if m == method and b == budget and c.information_floor and not math.isnan(c.mean)
        ]
        if ratios:
            lines.append(
                f"{method}: trained MSE / information floor = {min(ratios):.3g} .. {max(ratios):.3g} over "
                f"{len(ratios)} activations (1: limited by its features; >> 1: by its training)."
            )
    return lines


def _swept(cells: dict) -> list[str]:
    """The activations run at more than one budget."""
    activations, _, _ = _axes(cells)
    return [a for a in activations if len({b for x, _, b in cells if x == a}) > 1]


def sweep_table(cells: dict) -> tuple[list[str], list[list[str]]]:
    """Activation x method rows (activations run at several budgets), a ``mean ± std`` column per budget."""
    _, methods, budgets = _axes(cells)
    activations = _swept(cells)
    header = ["activation", "method", *(f"B={b}" for b in budgets)]
    rows = [
        [a, m, *(_fmt(cells.get((a, m, b))) for b in budgets)]
        for a in activations
        for m in methods
        if any((a, m, b) in cells for b in budgets)
    ]
    return header, rows


def sweep_floors_table(cells: dict) -> tuple[list[str], list[list[str]]]:
    """The floors beside the sweep: ``information floor / Eckart-Young floor`` per budget."""
    _, methods, budgets = _axes(cells)
    header = ["activation", "method", *(f"B={b}" for b in budgets)]

    def cell(c: Cell | None) -> str:
        if c is None or c.information_floor is None:
            return "-"
        return f"{c.information_floor:.3e} / {c.eckart_young_floor:.3e}"

    rows = [
        [a, m, *(cell(cells.get((a, m, b))) for b in budgets)]
        for a in _swept(cells)
        for m in methods
        if any(cells.get((a, m, b)) and cells[(a, m, b)].information_floor is not None for b in budgets)
    ]
    return header, rows


def write_cells(path: Path, cells: dict) -> None:
    """Long format: activation, method, budget, mse mean and std, seeds, diverged, train seconds, floors."""
    activations, methods, budgets = _axes(cells)
    header = [
        "activation",
        "method",
        "budget",
        "mse_mean",
        "mse_std",
        "seeds",
        "diverged",
        "train_seconds",
        "information_floor",
        "eckart_young_floor",
        "feature_dim",
        "not_started",
    ]
    found = ((a, m, b, cells.get((a, m, b))) for a in activations for m in methods for b in budgets)
    rows = [
        (
            a,
            m,
            b,
            c.mean,
            c.std,
            c.seeds,
            c.diverged,
            f"{c.seconds:.2f}",
            c.information_floor,
            c.eckart_young_floor,
            c.feature_dim,
            c.not_started,
        )
        for a, m, b, c in found
        if c is not None
    ]
    write_csv(path, header, rows)


#: The top of the bar plot's axis: ten times the MSE of predicting each column's mean (standardized units);
#: a bar above it is cut there and its value written on it.
PLOT_TOP = 10.0


def plot_bars(cells: dict, budget: int, path: Path) -> None:
    """Fig. 2 (left): grouped bars of the mean MSE per activation, one bar per method, std error bars."""
    plt = pyplot()

    activations, methods, _ = _axes(cells)
    activations = [a for a in activations if any((a, m, budget) in cells for m in methods)]
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(1.6 + 1.5 * len(activations), 3.6))
    diverged = []  # (x, color) of the cells whose every seed diverged: no bar, a label
    beyond = []  # (x, mean) of the bars above PLOT_TOP: cut there, their value written
    for i, method in enumerate(methods):
        found = [cells.get((a, method, budget)) for a in activations]
        xs = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(activations))]
        means = [c.mean if c else math.nan for c in found]
        stds = [c.std if c else 0.0 for c in found]
        lower = [min(s, 0.9 * m) if not math.isnan(m) else 0.0 for m, s in zip(means, stds, strict=True)]
        bars = ax.bar(xs, means, width, yerr=[lower, stds], capsize=2, label=method)
        color = bars.patches[0].get_facecolor() if bars.patches else None
        diverged += [(x, color) for x, c in zip(xs, found, strict=True) if c and math.isnan(c.mean)]
        beyond += [(x, m) for x, m in zip(xs, means, strict=True) if m > PLOT_TOP]
    ax.set_xticks(range(len(activations)), activations)
    if any(c.mean > 0 for c in cells.values() if not math.isnan(c.mean)):
        ax.set_yscale("log")  # (a log axis needs a positive value: not when every cell diverged)
    if beyond:
        ax.set_ylim(top=PLOT_TOP)
    for x, color in diverged:
        ax.text(x, 0.02, "diverged", transform=ax.get_xaxis_transform(), rotation=90, ha="center",
                va="bottom", fontsize=6, color=color)  # fmt: skip
    for x, mean in beyond:
        ax.text(x, 0.98, f"{mean:.1e}", transform=ax.get_xaxis_transform(), rotation=90, ha="center",
                va="top", fontsize=6)  # fmt: skip
    ax.set_ylabel("train MSE (standardized)")
    ax.set_title(f"single-layer fit, budget {budget}")
    ax.legend(fontsize=8, ncols=min(len(methods), 5))
    save_figure(fig, path, dpi=130)


def plot_budget(cells: dict, path: Path) -> None:
    """Fig. 2 (right): mean MSE against budget, one panel per swept activation, one line per method."""
    plt = pyplot()

    _, methods, budgets = _axes(cells)
    activations = _swept(cells)
    fig, axes = plt.subplots(1, len(activations), figsize=(3.2 * len(activations), 3.2), squeeze=False)
    for ax, activation in zip(axes[0], activations, strict=True):
        for method in methods:
            found = [(b, cells[(activation, method, b)]) for b in budgets if (activation, method, b) in cells]
            if not found:
                continue
            xs = [b for b, _ in found]
            means = [c.mean for _, c in found]
            stds = [c.std for _, c in found]
            ax.errorbar(xs, means, yerr=stds, marker="o", ms=3, capsize=2, label=method)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("random features / rank")
        ax.set_title(activation)
    axes[0][0].set_ylabel("train MSE (standardized)")
    axes[0][-1].legend(fontsize=8)
    save_figure(fig, path, dpi=130)


def claim_line(cells: dict, budget: int, method: str = "ralimp") -> str:
    """Whether ``method`` has the lowest mean MSE for every activation at ``budget`` (the paper's claim)."""
    activations, _, _ = _axes(cells)
    activations = [a for a in activations if lowest(cells, a, budget) is not None]
    wins = [a for a in activations if lowest(cells, a, budget) == method]
    verdict = "holds" if activations and len(wins) == len(activations) else "does not hold"
    return (
        f"{method} lowest mean MSE at budget {budget}: {len(wins)} of {len(activations)} activations "
        f"({', '.join(wins) or 'none'}); the claim {verdict} in these results."
    )


def report(config: ReportConfig) -> dict[str, str]:
    """Write the tables and plots of ``config.results``; returns the Markdown texts by name."""
    cells = aggregate([flat_record(r) for r in read_jsonl(config.results)])
    out = report_folder(config.results, config.report_dir)
    out.mkdir(parents=True, exist_ok=True)
    _, _, budgets = _axes(cells)
    budget = config.table_features if config.table_features in budgets else budgets[0]
    _, methods, _ = _axes(cells)
    claims = [claim_line(cells, budget, m) for m in ("ralimp", "ralimp-psi") if m in methods]
    idle = not_started_lines(cells, budget)
    texts = {
        "table": "\n\n".join(
            [markdown_table(*main_table(cells, budget)), *claims, *(["\n".join(idle)] if idle else [])]
        )
    }
    (out / "table.md").write_text(texts["table"] + "\n", encoding="utf-8")
    write_cells(out / "table.csv", {k: v for k, v in cells.items() if k[2] == budget})
    texts["by_method"] = write_table(out / "table_by_method", *method_table(cells, budget))
    floors = write_table(out / "floors", *floors_table(cells, budget))
    texts["floors"] = "\n\n".join([floors, *floor_lines(cells, budget)])
    plot_bars(cells, budget, out / "mse_bars.png")
    if _swept(cells):
        texts["sweep"] = markdown_table(*sweep_table(cells))
        (out / "sweep.md").write_text(texts["sweep"] + "\n", encoding="utf-8")
        write_cells(out / "sweep.csv", cells)
        texts["sweep_floors"] = write_table(out / "sweep_floors", *sweep_floors_table(cells))
        plot_budget(cells, out / "mse_vs_budget.png")
    return texts
