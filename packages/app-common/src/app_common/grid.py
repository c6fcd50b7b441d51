"""The one grid runner of the apps' sweeps and grids: resumable, sharded, isolated as the flag says.

The policy, the same in every app:

- The cells (runs) of a grid are enumerated in a fixed order; ``--shard i/n`` takes cells
  ``i, i + n, i + 2n, ...``, so ``n`` machines (or GPUs) split a grid without talking to each other.
- A cell is done when its run folder holds its record
  ([`finished_record`][app_common.records.finished_record]); done cells are skipped, and every other cell
  resumes its own checkpoint, so re-running the same command after a crash continues where it stopped.
- ``--isolation process`` runs each cell in a fresh child process
  ([`run_child`][app_common.process.run_child]): its peak memory is its own, a cell that fails does not
  end the grid (it is reported as failed), and SIGTERM sent to the grid reaches the running cell, which
  is waited for. ``--isolation in-process`` runs the cells one after another in this process: no
  interpreter start per cell, state (a data set) shared between cells, and an error ends the grid.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from app_common.fields import Fields, option
from app_common.process import run_child
from app_common.progress import progress
from app_common.records import finished_record

#: The isolations of a grid's cells (``--isolation``).
ISOLATIONS = ("process", "in-process")

Cell = TypeVar("Cell")


def parse_shard(shard: str) -> tuple[int, int]:
    """``(i, n)`` of ``shard = "i/n"``.

    Raises:
        ValueError: not two integers with ``0 <= i < n``, naming ``--shard``.
    """
    try:
        i, n = (int(part) for part in shard.split("/"))
    except ValueError:
        raise ValueError(f"--shard: expected 'i/n' with integers, got {shard!r}") from None
    if not 0 <= i < n:
        raise ValueError(f"--shard: expected 0 <= i < n, got {shard!r}")
    return i, n


@dataclass(frozen=True, kw_only=True)
class GridFields(Fields):
    """``--shard``, ``--isolation``: which part of the grid this process runs, and how each cell runs."""

    MAY_CHANGE_ON_RESUME: ClassVar[tuple[str, ...]] = ("shard", "isolation")

    shard: str = option("shard", "0/1")
    isolation: str = option("isolation", "in-process", choices=ISOLATIONS)

    def __post_init__(self) -> None:
        """Check both flags."""
        super().__post_init__()
        parse_shard(self.shard)
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"--isolation: expected one of {', '.join(ISOLATIONS)}, got {self.isolation!r}")


@dataclass
class GridOutcome(Generic[Cell]):
    """The run names of this shard's cells: ``done`` before, ``ran`` now, ``failed`` (process isolation)."""

    done: list[str] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    #: What ``run`` returned for each cell that ran in this process (in-process isolation).
    returned: list[Any] = field(default_factory=list)


def run_grid(
    cells: Sequence[Cell],
    run: Callable[[Cell], Any],
    *,
    place: Callable[[Cell], tuple[str | Path, str]],
    grid: GridFields,
    resume: bool = True,
    desc: str = "grid",
    show_progress: bool = True,
) -> GridOutcome[Cell]:
    """Run this shard's cells of ``cells`` that have no record yet, under ``grid.isolation``.

    Args:
        cells: every cell of the grid, in its fixed order (before sharding).
        run: runs one cell (with process isolation: a module-level function, and picklable cells).
        place: a cell's ``(out, run name)``: its record is ``<out>/runs/<name>/record.json``.
        grid: the ``--shard`` and ``--isolation`` settings.
        resume: skip the cells that have a record (``--no-resume``: none is skipped; each run starts over).
        desc: the progress bar's label.
        show_progress: draw a bar over the shard's cells.

    Raises:
        app_common.process.Terminated: SIGTERM while a child ran (it got it too and was waited for).
    """
    index, count = parse_shard(grid.shard)
    mine = list(cells)[index::count]
    outcome: GridOutcome[Cell] = GridOutcome()
    for cell in progress(
        mine, desc=f"{desc} {grid.shard}", unit="run", disable=not show_progress or not mine
    ):
        out, name = place(cell)
        if resume and finished_record(out, name) is not None:
            outcome.done.append(name)
        elif grid.isolation == "in-process":
            outcome.returned.append(run(cell))
            outcome.ran.append(name)
        else:
            exitcode = run_child(run, cell, name=name)
            (outcome.ran if exitcode == 0 else outcome.failed).append(name)
            if exitcode != 0:
                print(f"{name}: failed (exit code {exitcode}); the grid goes on")
    if mine:
        print(
            f"{desc} {grid.shard}: {len(mine)} runs, {len(outcome.done)} already done, {len(outcome.ran)} "
            f"ran now, {len(outcome.failed)} failed"
        )
    return outcome
