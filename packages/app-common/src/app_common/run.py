"""The run: what exists before the model (its folder, identity, seed, device and process group).

An app needs the device, the seeding, the process group and the "finished earlier?" answer before it
builds its model, and the harness ([`Trainer`][app_common.harness.Trainer]) needs the model before it
can train. So a run is two objects, built one after the other and each complete when constructed:

    run = Run.from_config(config, label=label)             # seeds everything, joins torchrun's group
    model = build(config).to(run.device)
    trainer = Trainer.from_config(config, run, model, optimizer)

`Run` has its own module because nothing in it depends on the step loop: it is the run's place
(``<out>/runs/<name>/``), its identity and its environment (threads, device, precision, the
``torchrun`` process group), which an app also uses around the loop (evaluation under `Run.autocast`,
the main process's printing, skipping a finished run with `Run.unless_finished`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import filelock
import torch

from app_common.checkpoint import Checkpointer, changed_settings, load_checkpoint
from app_common.device import autocast, resolve_device
from app_common.distributed import Distributed, setup_distributed, teardown_distributed
from app_common.fields import run_identity, run_name
from app_common.records import (
    CHECKPOINT,
    IDENTITY,
    LOCK,
    LOG,
    RECORD,
    RUNS,
    finished_record,
    read_identity,
    run_dir,
)
from app_common.seeding import seed_everything

T = TypeVar("T")

#: The arguments of `Run` that `Run.from_config` reads from the configuration's fields of the same name
#: (``RuntimeFields``, ``OutputFields`` and its seed): every configuration has them.
RUN_CONFIG_SETTINGS = ("out", "seed", "device", "dtype", "threads", "resume")


def config_settings(
    config: Any, required: Sequence[str], optional: Sequence[str], overrides: Mapping[str, Any]
) -> dict[str, Any]:
    """``config``'s fields ``required`` and those of ``optional`` it has, less the ones in ``overrides``.

    The one rule of `Run.from_config` and [`Trainer.from_config`][app_common.harness.Trainer.from_config].

    Raises:
        AttributeError: ``config`` lacks a field of ``required`` that ``overrides`` does not give either.
    """
    missing = [k for k in required if k not in overrides and not hasattr(config, k)]
    if missing:
        raise AttributeError(
            f"config: {type(config).__name__} has no field {', '.join(missing)}; expected the shared "
            "field groups (RuntimeFields, OptimizerFields, OutputFields) and a seed, or them as overrides"
        )
    return {
        k: getattr(config, k) for k in (*required, *optional) if k not in overrides and hasattr(config, k)
    }


class Run:
    """One run's place, identity and environment, set up at construction: its model comes next.

    Construction sets torch's CPU threads, joins the ``torchrun`` process group (or resolves the one
    device) and seeds everything with ``seed``, so that the model the app builds next is the same on
    every process and in a fresh or a resumed run.

    Args:
        name: the run's name: its folder ``<out>/runs/<name>/`` and its progress bar (`from_config`
            makes it [`run_name`][app_common.fields.run_name]``(label, identity)``, as every app does).
        out: the folder holding ``runs/``.
        identity: the run's identity ([`run_identity`][app_common.fields.run_identity]); a checkpoint of
            another is refused.
        seed: the run's seed.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:<i>``.
        dtype: autocast precision of the loss (``float32``: none).
        threads: CPU threads of torch (0: leave torch's default).
        resume: continue the run's checkpoint (and skip a finished run) if there is one.
        on_save: called with the step after each checkpoint (``app_common.testing.kill_at``).
        distributed: join the ``torchrun`` process group when there is one (False: one process).

    Attributes:
        dir: ``<out>/runs/<name>/``.
        dist: this process's place in the process group (one process without ``torchrun``).
        device: this process's device.
        checkpointer: ``<out>/runs/<name>/checkpoint.pt`` under ``identity`` and ``resume``.

    Raises:
        ValueError: a bad argument, naming it.
    """

    def __init__(
        self,
        *,
        name: str,
        out: str | Path,
        identity: Mapping[str, Any],
        seed: int,
        device: str | torch.device = "auto",
        dtype: str = "float32",
        threads: int = 0,
        resume: bool = True,
        on_save: Callable[[int], None] | None = None,
        distributed: bool = True,
    ) -> None:
        from spectraformer_core import check_int

        check_int("threads", threads, minimum=0)
        check_int("seed", seed, minimum=0)
        if threads:
            torch.set_num_threads(threads)
        self.dist: Distributed = (
            setup_distributed(device) if distributed else Distributed(device=resolve_device(device))
        )
        self.device = self.dist.device
        self.name, self.out, self.dir, self.seed = name, Path(out), run_dir(out, name), seed
        self.dtype, self.resume = dtype, resume
        self.checkpointer = Checkpointer(self.dir / CHECKPOINT, identity, resume=resume, on_save=on_save)
        self._lock = filelock.FileLock(self.dir / LOCK, timeout=0)
        seed_everything(seed)

    @classmethod
    def from_config(
        cls,
        config: Any,
        *,
        label: str,
        identity: Mapping[str, Any] | None = None,
        on_save: Callable[[int], None] | None = None,
        **overrides: Any,
    ) -> Run:
        """A run set from a configuration of the shared field groups: every app sets its runs up so.

        The apps' one run-identity scheme: the identity is
        [`run_identity`][app_common.fields.run_identity]``(config)`` unless given (a grid point's: the
        shared settings and the point's own), the name is
        [`run_name`][app_common.fields.run_name]``(label, identity)``, and a checkpoint resumes only under
        that identity. Each argument of ``RUN_CONFIG_SETTINGS`` comes from ``config``'s field of that name:
        ``out``, ``seed``, ``device``, ``dtype``, ``threads`` and ``resume``; ``overrides`` replace any of
        these (a grid point's ``seed``) or set the other arguments of `Run`.

        Args:
            config: the run's configuration.
            label: the readable head of the run's name (``listops-softmax-f64-s0``).
            identity: the run's identity (default: ``run_identity(config)``).
            on_save: called with the step after each checkpoint.
            **overrides: arguments of `Run` other than ``name`` and ``identity``.

        Raises:
            AttributeError: ``config`` lacks a field of ``RUN_CONFIG_SETTINGS`` that ``overrides`` does
                not give either.
        """
        settings = config_settings(config, RUN_CONFIG_SETTINGS, (), overrides)
        identity = run_identity(config) if identity is None else dict(identity)
        name = run_name(label, identity)
        return cls(name=name, identity=identity, on_save=on_save, **settings, **overrides)

    @property
    def is_main(self) -> bool:
        """True on the process that writes logs, checkpoints, records and progress bars."""
        return self.dist.is_main

    @property
    def log_path(self) -> Path:
        """``<out>/runs/<name>/log.jsonl``."""
        return self.dir / LOG

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """Autocast to the run's ``dtype`` on its device (the loss; the app's evaluation)."""
        return autocast(self.device, self.dtype)

    def finished(self) -> dict[str, Any] | None:
        """The run's record if it finished earlier and ``resume`` is on, else None.

        Without ``resume`` a finished run's record file is removed: the run starts over.
        """
        if not self.resume:
            if self.is_main:
                (self.dir / RECORD).unlink(missing_ok=True)
            return None
        return finished_record(self.out, self.name)

    def namesakes(self) -> dict[str, list[str]]:
        """The runs under ``out`` of this run's label and another identity, with their changed settings.

        ``{"dense-s0-1a2b3c4d": ["steps: 6 -> 5"]}``: what differs between each one's identity and this
        run's, read from its ``identity.json`` or, in a folder made before that file, its checkpoint (a
        run with neither lists nothing); for an error that says why a run is not found.
        """
        label = self.name.rsplit("-", 1)[0]
        found = {}
        for folder in sorted((self.out / RUNS).glob(f"{label}-*")):
            if folder.name != self.name and folder.name.rsplit("-", 1)[0] == label:
                saved = read_identity(folder / IDENTITY)
                if saved is None:
                    state = load_checkpoint(folder / CHECKPOINT)
                    saved = {} if state is None else state.get("identity", {})
                found[folder.name] = changed_settings(saved, self.checkpointer.identity) if saved else []
        return found

    def claim(self) -> None:
        """Hold the run's ``train.lock`` for training it (on the main process; again: nothing more).

        An operating-system file lock: `release` or the process's end frees it, so a killed run leaves
        none behind.

        Raises:
            RuntimeError: another process holds it (it trains or resumes this run now).
        """
        if not self.is_main or self._lock.is_locked:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire()
        except filelock.Timeout:
            raise RuntimeError(
                f"{self.name}: another process trains this run now ({self.dir / LOCK} is held); wait for it "
                "or stop it before resuming the run here"
            ) from None

    def release(self) -> None:
        """Free the run's ``train.lock`` if this process holds it."""
        self._lock.release(force=True)

    def close(self) -> None:
        """Leave the process group, if the run joined one."""
        teardown_distributed()

    def unless_finished(self, body: Callable[[Run], T]) -> T | None:
        """``body(self)``, or None when the run finished earlier (said once); the run is closed after.

        The one rule of every app's run: a finished run is skipped, and the process group is left
        whatever happens.
        """
        try:
            if self.finished() is not None:
                if self.is_main:
                    print(f"{self.name}: finished earlier (see {self.dir}); nothing to do")
                return None
            return body(self)
        finally:
            self.close()
