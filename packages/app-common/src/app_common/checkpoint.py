"""Checkpoints: atomic writes, the apps' one resume policy, and the log rewind.

The policy is [`Checkpointer`][app_common.checkpoint.Checkpointer]'s; the rewind makes a resumed run's log
equal an unbroken one's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from app_common.results import append_jsonl, read_jsonl


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` with ``torch.save`` to a temporary file beside ``path``, then rename it over ``path``.

    The rename is atomic on POSIX file systems: readers see the old checkpoint or the new one, never half
    of one. Keep ``state`` to tensors, numbers, strings, lists and dicts so that
    [`load_checkpoint`][app_common.checkpoint.load_checkpoint] reads it with ``weights_only=True``.

    Returns:
        ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_checkpoint(path: str | Path, *, map_location: str | torch.device = "cpu") -> dict[str, Any] | None:
    """The state saved at ``path``, or None when there is no checkpoint there.

    Loads with ``weights_only=True`` (no arbitrary code runs from the file).

    Raises:
        ValueError: the file exists but cannot be read as a checkpoint, naming the path.
    """
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:
        raise ValueError(f"{path}: not a readable checkpoint ({type(error).__name__}: {error})") from error


def changed_settings(saved: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """``["lr: 0.001 -> 0.002", ...]``: the keys whose values differ between two identities, sorted."""
    keys = sorted(set(saved) | set(wanted))
    missing = object()
    return [
        f"{k}: {saved.get(k, '(unset)')!r} -> {wanted.get(k, '(unset)')!r}"
        for k in keys
        if saved.get(k, missing) != wanted.get(k, missing)
    ]


class Checkpointer:
    """One run's checkpoint file under the apps' one resume policy.

    The policy: with ``resume`` (``--resume``, the default in every app), `load` returns the saved
    state when the file exists and was written under the same ``identity`` (the run's settings minus those
    that may change on resume, [`run_identity`][app_common.fields.run_identity]), and refuses with the
    changed keys listed when it was not; without ``resume`` the run starts over and its first `save` replaces
    the file.

    Args:
        path: the checkpoint file.
        identity: the run's identity (plain values: numbers, strings, lists, dicts).
        resume: whether `load` reads an existing checkpoint.
        on_save: called with the step after every `save` (progress hooks; tests raise there to
            kill a run right after a checkpoint, see `app_common.testing.kill_at`).
    """

    def __init__(
        self,
        path: str | Path,
        identity: Mapping[str, Any],
        *,
        resume: bool = True,
        on_save: Callable[[int], None] | None = None,
    ) -> None:
        self.path, self.identity, self.resume, self.on_save = Path(path), dict(identity), resume, on_save

    def load(self, *, map_location: str | torch.device = "cpu") -> dict[str, Any] | None:
        """The saved state (with its ``"step"``), or None: nothing saved, or ``resume`` off.

        Raises:
            ValueError: the checkpoint was saved under another identity, listing the changed keys.
        """
        if not self.resume:
            return None
        state = load_checkpoint(self.path, map_location=map_location)
        if state is None:
            return None
        changed = changed_settings(state.get("identity", {}), self.identity)
        if changed:
            raise ValueError(
                f"{self.path}: saved by a run with other settings ({'; '.join(changed)}); resume with the "
                "same settings, or pass --no-resume to start over or another --out"
            )
        return state

    def save(self, step: int, state: Mapping[str, Any], *, write: bool = True) -> None:
        """Write ``state`` with the step and the identity (atomically), then call ``on_save(step)``.

        Args:
            step: steps done.
            state: what to save (see [`state_dicts`][app_common.checkpoint.state_dicts]).
            write: False on the processes that do not write (ranks other than 0); the hook still runs.
        """
        if write:
            save_checkpoint(self.path, {**state, "step": step, "identity": self.identity})
        if self.on_save is not None:
            self.on_save(step)

    def remove(self) -> None:
        """Delete the checkpoint (a finished run that keeps no checkpoint)."""
        self.path.unlink(missing_ok=True)


def state_dicts(**parts: Any) -> dict[str, Any]:
    """``{name: part.state_dict()}`` of modules, optimizers and schedulers, for a checkpoint."""
    return {name: part.state_dict() for name, part in parts.items()}


def load_state_dicts(state: Mapping[str, Any], **parts: Any) -> None:
    """Load ``state[name]`` into each ``part`` (the inverse of `state_dicts`).

    Raises:
        ValueError: a part the checkpoint does not hold, naming it.
    """
    missing = [name for name in parts if name not in state]
    if missing:
        raise ValueError(f"checkpoint: holds no {', '.join(missing)}; found {', '.join(sorted(state))}")
    for name, part in parts.items():
        part.load_state_dict(state[name])


def rewind_log(path: str | Path, step: int, *, key: str = "step") -> None:
    """Drop the JSON lines of ``path`` whose ``key`` is past ``step``.

    Those lines were written after the checkpoint a run resumes from, by the run that was killed.
    """
    path = Path(path)
    kept = [r for r in read_jsonl(path, missing_ok=True) if r[key] <= step]
    path.unlink(missing_ok=True)
    for record in kept:
        append_jsonl(path, record)
