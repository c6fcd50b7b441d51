"""``vit-finetune report``: a results file as a Markdown/CSV table and PNG plots.

One row per run (the latest record of each), with accuracy, parameters and inference throughput against the
dense model: the accuracy of the dense run of the same data, model and seed, and the parameters and
throughput of the dense model measured in the same process as the run. Plots: training curves of every run
(``curves.png``: training loss and evaluation accuracy against the step), and accuracy against k per layer
kind with the dense accuracy as a line (``accuracy_vs_k.png``, when the results hold more than one k).
"""

from __future__ import annotations

from pathlib import Path

from app_common.plots import pyplot, save_figure
from app_common.records import flat_record, report_folder
from app_common.results import read_jsonl, write_table
from vit_finetune.config import ReportConfig

HEADER = [
    "data",
    "model",
    "layer",
    "features",
    "init",
    "k",
    "attention",
    "accuracy",
    "vs dense",
    "params",
    "params / dense",
    "compressed / dense",
    "img/s",
    "img/s / dense",
    "compressed img/s / dense",
    "train s",
]


def swapped(record: dict) -> str | None:
    """The attention a run swapped in, or None (its model's own softmax attention)."""
    return None if record["attention"] in (None, "softmax") else record["attention"]


def latest(records: list[dict]) -> list[dict]:
    """The last record of each run, in first-seen order."""
    by_run: dict[str, dict] = {}
    for record in records:
        by_run[record["name"]] = record
    return list(by_run.values())


def dense_accuracy(records: list[dict], record: dict) -> float | None:
    """Accuracy of the dense run (no replacement, no attention swap) of the same data, model and seed."""
    for other in records:
        same = all(other[k] == record[k] for k in ("data", "model", "seed", "eval_split"))
        if same and other["layer"] == "dense" and swapped(other) is None:
            return other["accuracy"]
    return None


def table_rows(records: list[dict]) -> list[list[str]]:
    """The rows of `HEADER`."""
    rows = []
    for r in sorted(
        records, key=lambda r: (r["data"], r["model"], r["layer"] != "dense", r["layer"], r["last_k"])
    ):
        base = dense_accuracy(records, r)
        delta = "" if base is None else f"{100 * (r['accuracy'] - base):+.1f}"
        rows.append(
            [
                r["data"],
                r["model"],
                r["layer"],
                "-" if r["layer"] == "dense" else str(r["features"]),
                "-" if r["layer"] == "dense" else r.get("init", "psi"),
                str(r["last_k"]),
                swapped(r) or "softmax",
                f"{100 * r['accuracy']:.1f}",
                delta,
                f"{r['trainable_parameters']:,}",
                f"{r['trainable_parameters'] / r['parameters_dense']:.3f}",
                f"{r['parameters_compressed'] / r['parameters_dense']:.3f}",
                f"{r['throughput']:.0f}",
                f"{r['throughput'] / r['throughput_dense']:.2f}",
                f"{r['throughput_compressed'] / r['throughput_dense']:.2f}",
                f"{r['train_seconds']:.0f}",
            ]
        )
    return rows


def plot_curves(records: list[dict], path: Path) -> None:
    """Training loss and evaluation accuracy against the step, one line per run."""
    plt = pyplot()

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for r in records:
        log = read_jsonl(r["log"], missing_ok=True)
        label = (
            f"{r['layer']}"
            + (f" k={r['last_k']}" if r["layer"] != "dense" else "")
            + (f" +{swapped(r)}" if swapped(r) else "")
        )
        key = f"{r['eval_split']}_accuracy"
        losses = [(e["step"], e["train_loss"]) for e in log if "train_loss" in e]
        accs = [(e["step"], e[key]) for e in log if key in e]
        style = {"color": "black", "linewidth": 2} if r["layer"] == "dense" and not swapped(r) else {}
        if losses:
            ax_loss.plot(*zip(*losses, strict=True), label=label, **style)
        if accs:
            ax_acc.plot(*zip(*accs, strict=True), label=label, marker=".", **style)
    ax_loss.set(xlabel="step", ylabel="training loss", yscale="log", title="training loss")
    ax_acc.set(xlabel="step", ylabel="accuracy", title="evaluation accuracy")
    ax_acc.legend(fontsize=8)
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
    save_figure(fig, path, dpi=120)


def plot_accuracy_vs_k(records: list[dict], path: Path) -> None:
    """Accuracy against k per layer kind; the dense accuracy as a horizontal line."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in records:
        if r["layer"] == "dense" and swapped(r) is None:
            ax.axhline(100 * r["accuracy"], color="black", linestyle="--", label=f"dense ({r['data']})")
    kinds = sorted(
        {(r["layer"], swapped(r)) for r in records if r["layer"] != "dense" or swapped(r)}, key=str
    )
    for layer, attention in kinds:
        points = sorted(
            (r["last_k"], 100 * r["accuracy"])
            for r in records
            if (r["layer"], swapped(r)) == (layer, attention)
        )
        ax.plot(*zip(*points, strict=True), marker="o", label=layer + (f" +{attention}" if attention else ""))
    ax.set(xlabel="k (last blocks replaced)", ylabel="accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path, dpi=120)


def report(config: ReportConfig) -> str:
    """Write ``table.md``, ``table.csv``, ``curves.png`` (``accuracy_vs_k.png``); return the table."""
    records = latest([flat_record(r) for r in read_jsonl(config.results)])
    if not records:
        raise ValueError(f"results: {config.results} holds no record")
    out = report_folder(config.results, config.report_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = write_table(out / "table", HEADER, table_rows(records))
    plot_curves(records, out / "curves.png")
    if len({r["last_k"] for r in records if r["layer"] != "dense"}) > 1:
        plot_accuracy_vs_k(records, out / "accuracy_vs_k.png")
    return table
