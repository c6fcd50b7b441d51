"""``gpt-uptrain report RESULTS``: validation perplexity table (Markdown, CSV) and loss curves (PNG)."""

from __future__ import annotations

from pathlib import Path

from app_common.plots import pyplot, save_figure
from app_common.records import flat_record, report_folder
from app_common.results import read_jsonl, write_table

HEADER = [
    "Run",
    "Layer",
    "Features",
    "Init",
    "Replaced blocks",
    "Attention",
    "Steps",
    "Tokens",
    "Val loss",
    "Val perplexity",
    "Parameters (M)",
    "Time (s)",
]


def table(records: list[dict]) -> tuple[list[str], list[list[str]]]:
    """One row per record, in file order (the latest record of a run label wins)."""
    latest = {r["label"]: r for r in records}
    rows = [
        [
            r["label"],
            r["layer"],
            "-" if r["layer"] == "dense" else str(r["features"]),
            "-" if r["layer"] == "dense" else r["init"],
            str(r["last_k"]),
            r["attention"],
            str(r["steps"]),
            f"{r['tokens']:,}",
            f"{r['val_loss']:.4f}",
            f"{r['val_ppl']:.3f}",
            f"{r['num_parameters'] / 1e6:.3f}",
            f"{r['train_seconds']:.0f}",
        ]
        for r in latest.values()
    ]
    return HEADER, rows


def loss_curves(records: list[dict], path: Path) -> Path:
    """Training loss (thin) and validation loss (markers) against optimizer steps, one colour per run."""
    plt = pyplot()

    figure, ax = plt.subplots(figsize=(7, 4.2))
    latest = {r["label"]: r for r in records}
    for index, record in enumerate(latest.values()):
        log = read_jsonl(record["log"], missing_ok=True)
        color = f"C{index % 10}"
        train = [(r["step"], r["train_loss"]) for r in log if "train_loss" in r]
        val = [(r["step"], r["val_loss"]) for r in log if "val_loss" in r]
        if train:
            ax.plot(*zip(*train, strict=True), color=color, lw=0.8, alpha=0.6)
        if val:
            ax.plot(
                *zip(*val, strict=True),
                "o-",
                color=color,
                ms=4,
                label=f"{record['label']} (val ppl {record['val_ppl']:.2f})",
            )
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross entropy (nats/token)")
    ax.set_title("Training (thin) and validation (markers) loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(figure, path, dpi=120)


def report(results: str | Path, out: str | Path | None = None) -> str:
    """Write ``table.md``, ``table.csv`` and ``loss_curves.png`` to ``out``; returns the Markdown table.

    Raises:
        FileNotFoundError: no results file.
        ValueError: an empty file or a record without the fields of a ``train`` record.
    """
    records = [flat_record(r) for r in read_jsonl(results)]
    if not records:
        raise ValueError(f"{results}: no results yet")
    needed = (
        "label",
        "layer",
        "features",
        "init",
        "last_k",
        "attention",
        "steps",
        "tokens",
        "val_loss",
        "val_ppl",
        "num_parameters",
        "log",
    )
    for number, record in enumerate(records, start=1):
        missing = [k for k in needed if k not in record]
        if missing:
            raise ValueError(f"{results}: record {number} lacks {', '.join(missing)}")
    out = report_folder(results, out)
    out.mkdir(parents=True, exist_ok=True)
    text = write_table(out / "table", *table(records))
    loss_curves(records, out / "loss_curves.png")
    return text
