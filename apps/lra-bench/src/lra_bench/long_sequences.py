"""What linear attention buys at long sequences: one attention layer's time and memory against softmax.

``lra-bench quick`` trains at 100 tokens, where softmax attention is the fastest; this table, printed beside
its Table 1, shows the same attentions at 1K, 4K, 8K and 16K tokens. Each point is one forward+backward of
``rf_attention.create(name, dim, heads, num_features=...)`` (the Table 6 model's layer width and heads)
on ``x (1, N, dim)`` on the CPU, timed (``app_common.measure.Timer``) and with its peak memory
(``app_common.measure.PeakMemoryMeter``, glibc's mmap threshold fixed so that the resident peak counts the
tensors alive at once), after one forward+backward at the shortest length. Each point is measured
``repeats`` times, the rounds interleaved (every attention and length once per round, so a change of the
machine's load hits every row alike), and the table prints the medians: one run per point made the ratios flip
direction from run to run. Softmax's quadratic cost sets the table's time: about 8 s a round on a 2-core
machine at one thread, 5 s of it softmax's forward+backward at 16K.

Memory stays near softmax's because ``scaled_dot_product_attention`` on the CPU runs a memory-efficient
(flash-style) kernel that never forms the ``N x N`` matrix: its memory is linear in ``N`` too, and only its
time is quadratic.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch

import rf_attention
from app_common.measure import PeakMemoryMeter, Timer, fix_mmap_threshold
from lra_bench.config import ModelConfig
from spectraformer_core import check_int, markdown_table

#: Where the table's time goes is softmax's forward+backward at the longest length (quadratic).
LENGTHS = (1024, 4096, 8192, 16384)


def measure(
    name: str, n: int, *, dim: int, heads: int, features: int, warmup_length: int
) -> tuple[float, int]:
    """Seconds and peak bytes (above the resident size before; 0 at least) of a forward+backward at ``n``."""
    module = rf_attention.create(name, dim, heads, num_features=features, seed=0)
    module(torch.randn(1, warmup_length, dim, requires_grad=True)).sum().backward()
    x = torch.randn(1, n, dim, requires_grad=True)
    with PeakMemoryMeter("cpu") as meter, Timer() as timer:
        module(x).sum().backward()
    return timer.elapsed, max(meter.added, 0)


def long_sequence_table(
    attentions: Sequence[str],
    *,
    features: int,
    lengths: Sequence[int] = LENGTHS,
    model: ModelConfig | None = None,
    repeats: int = 3,
) -> str:
    """Markdown: per attention and N, forward+backward ms and peak MiB, each with its ratio to softmax's.

    Time ratio: softmax's time over the attention's (above 1: faster than softmax); memory ratio: the
    attention's peak over softmax's. Softmax is measured even when ``attentions`` leaves it out. Each
    figure is the median of ``repeats`` interleaved rounds.
    """
    check_int("repeats", repeats, minimum=1)
    model = model or ModelConfig()
    fix_mmap_threshold()
    names = list(dict.fromkeys(["softmax", *attentions]))
    shape = {"dim": model.dim, "heads": model.num_heads, "features": features, "warmup_length": min(lengths)}
    rounds = [
        {(name, n): measure(name, n, **shape) for n in sorted(lengths) for name in names}
        for _ in range(repeats)
    ]
    points = {
        key: (statistics.median(r[key][0] for r in rounds), statistics.median(r[key][1] for r in rounds))
        for key in rounds[0]
    }
    header = ["attention"]
    for n in sorted(lengths):
        header += [f"N = {n:,}: ms (speed-up)", f"N = {n:,}: MiB (x softmax)"]
    rows = []
    for name in names:
        row = [name]
        for n in sorted(lengths):
            (seconds, peak), (soft_seconds, soft_peak) = points[(name, n)], points[("softmax", n)]
            row += [
                f"{1e3 * seconds:,.0f} ({soft_seconds / seconds:.2f}x)",
                f"{peak / 2**20:,.1f} ({max(peak, 1) / max(soft_peak, 1):.2f}x)",
            ]
        rows.append(row)
    title = (
        f"One attention layer's forward+backward on the CPU, x (1, N, {model.dim}), {model.num_heads} heads, "
        f"{features} features, median of {repeats} interleaved runs per point (speed-up: softmax's time / "
        "the row's). Memory stays near softmax's: its memory-efficient SDPA kernel is linear in N too."
    )
    return f"{title}\n\n{markdown_table(header, rows)}"
