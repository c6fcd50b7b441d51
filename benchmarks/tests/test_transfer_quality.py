"""The transfer-quality table at a tiny size: the window rows reach ``linearize`` and the ratio column."""

import dataclasses
import re

import pytest
import torch

from spectraformer_benchmarks import transfer_quality

WINDOW_ROWS = [row for row in transfer_quality.ROWS if "window" in row.linearize]


def test_the_table_has_a_window_row_for_a_random_pair_and_a_learned_map():
    assert {row.name for row in WINDOW_ROWS} == {"posrf-orf", "hedgehog"}


@pytest.mark.parametrize("row", WINDOW_ROWS, ids=lambda row: row.label)
def test_a_window_over_the_whole_context_is_the_teacher(row):
    # Every position in the window: exact causal softmax (a learned map's factor cancels in the one
    # normalizer), so every error is float32 rounding, where the same row without a window is not.
    teacher = transfer_quality.peaked_llama()
    ids = torch.randint(0, transfer_quality.VOCAB, (2, transfer_quality.CONTEXT))
    with torch.no_grad():
        teacher_logits = teacher(ids).logits
    whole = dataclasses.replace(row, linearize={**row.linearize, "window": transfer_quality.CONTEXT})
    plain = dataclasses.replace(row, linearize={k: v for k, v in row.linearize.items() if k != "window"})
    exact_layers, exact_logits = transfer_quality.errors(
        transfer_quality.converted(teacher, whole, 8), ids, teacher_logits
    )
    rf_layers, _ = transfer_quality.errors(transfer_quality.converted(teacher, plain, 8), ids, teacher_logits)
    assert max(*exact_layers, exact_logits) < 1e-9
    assert min(rf_layers) > 1e-4


def test_the_last_column_divides_each_error_after_transfer_by_the_first_rows(monkeypatch, capsys):
    monkeypatch.setattr(transfer_quality, "ROWS", [transfer_quality.ROWS[0], WINDOW_ROWS[0]])
    transfer_quality.main(["--steps", "1", "--batch", "2", "--features", "8"])
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| posrf-orf")]
    first, window = ([float(after) for after in re.findall(r"-> ([0-9.]+)\)", line)] for line in table[-2:])
    ratios = [float(ratio) for ratio in table[-1].split("|")[-2].split(" / ")]
    assert table[-2].endswith("| 1.00 / 1.00 / 1.00 |")
    assert len(first) == len(window) == len(ratios) == transfer_quality.LAYERS + 1
    # The printed errors have 4 decimals and the ratios 2: the ratios of the printed errors agree to 0.01.
    assert ratios == pytest.approx([w / f for w, f in zip(window, first, strict=True)], abs=1e-2)


def test_lr_reaches_the_transfer_and_row_picks_rows_by_label(monkeypatch, capsys):
    seen, transfer = [], transfer_quality.attention_transfer

    def recording_transfer(model, batches, *, steps, **options):
        seen.append(options)
        return transfer(model, batches, steps=steps, **options)

    monkeypatch.setattr(transfer_quality, "attention_transfer", recording_transfer)
    label = transfer_quality.ROWS[1].label  # a row with its own lr: --lr wins over it
    transfer_quality.main(["--steps", "1", "--batch", "2", "--features", "8", "--row", label, "--lr", "3e-3"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| posrf-orf")]
    assert seen == [{**transfer_quality.ROWS[1].transfer, "lr": 3e-3}]
    assert {line.split(" | ")[0] for line in rows} == {f"| {label}"}
    with pytest.raises(SystemExit, match="--row"):
        transfer_quality.main(["--row", "no such row"])
