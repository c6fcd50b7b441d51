"""The one grid runner: shards, skipping cells with a record, in-process and process isolation."""

import json
import sys

import pytest

from app_common.grid import GridFields, parse_shard, run_grid
from app_common.records import RECORD, run_dir


def _grid(shard="0/1", isolation="in-process"):
    return GridFields(shard=shard, isolation=isolation)


def _runner(out, ran):
    """A cell's run: note it, and write its record."""

    def run(cell):
        ran.append(cell)
        folder = run_dir(out, f"c{cell}")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / RECORD).write_text(json.dumps({"cell": cell}))
        return cell * 10

    return run


def test_the_shards_run_disjoint_parts_that_cover_the_grid(tmp_path):
    ran = []
    for i in range(3):
        run_grid(range(7), _runner(tmp_path, ran), place=lambda c: (tmp_path, f"c{c}"), grid=_grid(f"{i}/3"))
    assert ran == [0, 3, 6, 1, 4, 2, 5]


def test_a_rerun_skips_the_cells_that_have_a_record(tmp_path):
    ran = []
    run_grid([0, 1], _runner(tmp_path, ran), place=lambda c: (tmp_path, f"c{c}"), grid=_grid())
    again = run_grid([0, 1, 2], _runner(tmp_path, ran), place=lambda c: (tmp_path, f"c{c}"), grid=_grid())
    assert (again.done, again.ran, again.returned) == (["c0", "c1"], ["c2"], [20])


def test_without_resume_no_cell_is_skipped(tmp_path):
    ran = []
    run_grid([0, 1], _runner(tmp_path, ran), place=lambda c: (tmp_path, f"c{c}"), grid=_grid())
    run_grid([0, 1], _runner(tmp_path, ran), place=lambda c: (tmp_path, f"c{c}"), grid=_grid(), resume=False)
    assert ran == [0, 1, 0, 1]


def test_in_process_an_error_ends_the_grid(tmp_path):
    def run(cell):
        raise RuntimeError(f"cell {cell}")

    with pytest.raises(RuntimeError, match="cell 0"):
        run_grid([0, 1], run, place=lambda c: (tmp_path, f"c{c}"), grid=_grid())


def test_with_process_isolation_a_failing_cell_is_reported_and_the_others_run(tmp_path):
    # sys.exit(cell): the child's exit code is the cell (0 ran, 3 failed)
    outcome = run_grid(
        [0, 3, 0], sys.exit, place=lambda c: (tmp_path, f"c{c}"), grid=_grid(isolation="process")
    )
    assert (outcome.ran, outcome.failed) == (["c0", "c0"], ["c3"])


@pytest.mark.parametrize("shard", ["3/3", "-1/2", "half", "1/2/3"])
def test_a_bad_shard_is_refused_naming_the_flag(shard):
    with pytest.raises(ValueError, match="--shard"):
        parse_shard(shard)


def test_an_unknown_isolation_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match="--isolation: expected one of process, in-process"):
        GridFields(isolation="thread")
