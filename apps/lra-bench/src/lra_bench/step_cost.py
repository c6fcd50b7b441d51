"""The cost of one training step at the LRA ListOps setting of Table 6, per attention.

``lra-bench quick`` trains at 100 tokens; a run at the paper's setting (2,000 tokens, batch 32, the Table 6
model) costs what this table shows per step: an AdamW step of
[`LRAClassifier`][lra_bench.model.LRAClassifier] on random ListOps-sized tokens, on the CPU, after one warm-up
step. The time is the median over ``steps`` measured steps (``app_common.measure.Timer``), the memory the
peak of one step (``app_common.measure.PeakMemoryMeter``, glibc's mmap threshold fixed so that the peak
counts the tensors alive together). Softmax's quadratic attention sets the table's time: about 20 s a step at
one thread on a 2-core machine.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch

from app_common.measure import PeakMemoryMeter, Timer, fix_mmap_threshold
from lra_bench.config import TABLE_6, ModelConfig
from lra_bench.model import LRAClassifier
from spectraformer_core import markdown_table

#: Table 6's ListOps vocabulary size and classes.
LISTOPS_VOCAB_SIZE, LISTOPS_CLASSES = 32, 10


def step_seconds_and_peak(
    attention: str, *, features: int, batch_size: int, length: int, steps: int, seed: int = 0
) -> tuple[float, int]:
    """Median seconds of ``steps`` AdamW steps and the peak bytes of one, after a warm-up step."""
    model = LRAClassifier(
        ModelConfig(attention=attention, attention_features=features),
        vocab_size=LISTOPS_VOCAB_SIZE,
        num_classes=LISTOPS_CLASSES,
        pair=False,
        max_length=length,
        seed=seed,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=TABLE_6["listops"].lr)
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, LISTOPS_VOCAB_SIZE, (batch_size, length), generator=generator)
    mask = torch.zeros(batch_size, length, dtype=torch.bool)
    labels = torch.randint(0, LISTOPS_CLASSES, (batch_size,), generator=generator)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(tokens, mask), labels).backward()
        optimizer.step()

    step()
    times, peak = [], 0
    for _ in range(steps):
        with PeakMemoryMeter("cpu") as meter, Timer() as timer:
            step()
        times.append(timer.elapsed)
        peak = max(peak, meter.added)
    return statistics.median(times), peak


def listops_step_table(
    attentions: Sequence[str], *, features: int = 128, steps: int = 1, length: int | None = None
) -> str:
    """Markdown: per attention, seconds and peak GiB of one training step at Table 6's ListOps setting.

    ``length`` (default Table 6's 2,000) and the batch (Table 6's 32) are those of the paper's runs; each
    row also gives its ratio to softmax's (measured even when ``attentions`` leaves it out).
    """
    row = TABLE_6["listops"]
    length = row.max_length if length is None else length
    fix_mmap_threshold()
    names = list(dict.fromkeys(["softmax", *attentions]))
    shape = {"features": features, "batch_size": row.batch_size, "length": length, "steps": steps}
    points = {name: step_seconds_and_peak(name, **shape) for name in names}
    soft_seconds, soft_peak = points["softmax"]
    rows = [
        [
            name,
            f"{seconds:,.2f} ({soft_seconds / seconds:.2f}x)",
            f"{peak / 2**30:,.2f} ({max(peak, 1) / max(soft_peak, 1):.2f}x)",
        ]
        for name, (seconds, peak) in points.items()
    ]
    title = (
        f"One training step of the Table 6 model at the ListOps setting (batch {row.batch_size}, {length:,} "
        f"tokens, {features} features), CPU, median of {steps} after a warm-up step (speed-up: softmax's "
        "time / the row's; memory: the step's peak)"
    )
    return (
        f"{title}\n\n{markdown_table(['attention', 's per step (speed-up)', 'peak GiB (x softmax)'], rows)}"
    )
