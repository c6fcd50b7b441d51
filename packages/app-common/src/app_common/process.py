"""Child processes that die with their parent: a sweep's runs, each in a fresh interpreter."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from typing import Any


class Terminated(SystemExit):
    """The parent got SIGTERM while a child ran; the child was sent it too and waited for.

    A ``SystemExit`` with code ``128 + SIGTERM`` (143), as a shell reports a process killed by it.
    """


def run_child(target: Callable[..., Any], *args: Any, name: str | None = None) -> int:
    """Run ``target(*args)`` in a fresh (``spawn``) process and wait for it; its exit code.

    While the child runs, SIGTERM sent to this process is forwarded to the child, the child is waited
    for (so it leaves no orphan and its checkpoint is whole), and
    [`Terminated`][app_common.process.Terminated] is
    raised.

    Raises:
        Terminated: SIGTERM arrived while the child ran.
    """
    process = multiprocessing.get_context("spawn").Process(target=target, args=args, name=name)
    received: list[int] = []

    def forward(signum: int, frame: object) -> None:
        received.append(signum)
        if process.pid is not None:
            os.kill(process.pid, signum)

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, forward) if in_main_thread else None
    try:
        process.start()
        if received:  # a signal between installing the handler and the start
            assert process.pid is not None  # started
            os.kill(process.pid, signal.SIGTERM)
        process.join()
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
    if received:
        raise Terminated(128 + signal.SIGTERM)
    assert process.exitcode is not None  # joined
    return process.exitcode
