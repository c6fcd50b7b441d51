"""Test helpers the apps' test suites share: kill a run right after a checkpoint."""

from __future__ import annotations

from collections.abc import Callable


class Killed(Exception):
    """Raised by `kill_at`'s hook: stands for the process being killed."""


def kill_at(step: int) -> Callable[[int], None]:
    """An ``on_save`` hook of [`Checkpointer`][app_common.Checkpointer] that raises `Killed`.

    It raises once the checkpoint of ``step`` is on disk, leaving the run as a kill right after it would.
    """

    def hook(at: int) -> None:
        if at == step:
            raise Killed(f"killed after the checkpoint of step {step}")

    return hook
