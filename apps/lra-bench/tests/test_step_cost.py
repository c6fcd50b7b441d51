"""The quickstart's step-cost table: one training step of the Table 6 model per attention."""

import pytest

from lra_bench.step_cost import listops_step_table, step_seconds_and_peak


@pytest.fixture(scope="module")
def rows():
    table = listops_step_table(["performer"], features=8, length=48)
    lines = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[1:]]


def test_softmax_is_measured_first_and_is_its_own_reference(rows):
    assert [row[0] for row in rows] == ["softmax", "performer"]
    assert rows[0][1].endswith("(1.00x)")
    assert rows[0][2].endswith("(1.00x)")


def test_a_step_takes_positive_time_and_no_negative_memory():
    seconds, peak = step_seconds_and_peak("performer", features=8, batch_size=2, length=16, steps=2)
    assert seconds > 0
    assert peak >= 0
