"""The quickstart's long-sequence table: one row per attention, a time and a memory column per length."""

import pytest

from lra_bench.config import ModelConfig
from lra_bench.long_sequences import long_sequence_table

LENGTHS = (64, 256)


@pytest.fixture(scope="module")
def rows():
    table = long_sequence_table(
        ["performer", "oprf-fastfoodl"], features=8, lengths=LENGTHS, model=ModelConfig(dim=16, num_heads=2)
    )
    lines = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[1:]]


def test_softmax_and_each_attention_get_a_row(rows):
    assert [row[0] for row in rows] == ["softmax", "performer", "oprf-fastfoodl"]


def test_each_length_gets_a_time_and_a_memory_column(rows):
    assert all(len(row) == 1 + 2 * len(LENGTHS) for row in rows)


def ratio(cell: str) -> float:
    return float(cell.split("(")[1].rstrip("x)"))


def test_the_speed_ratios_are_positive(rows):
    assert all(ratio(cell) > 0 for row in rows for cell in row[1::2])


def test_the_peaks_and_their_ratios_are_not_negative(rows):
    # at these sizes a peak is within the resident counters' granularity: it may read 0, never below
    assert all(float(cell.split()[0]) >= 0 and ratio(cell) >= 0 for row in rows for cell in row[2::2])


def test_softmax_is_its_own_reference(rows):
    assert all(cell.endswith("(1.00x)") for cell in rows[0][1:])


def test_repeats_must_be_a_positive_count():
    with pytest.raises(ValueError, match="repeats"):
        long_sequence_table(["performer"], features=8, lengths=LENGTHS, repeats=0)
