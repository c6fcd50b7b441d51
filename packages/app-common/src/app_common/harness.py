"""The apps' one training harness: the app gives its model, data, loss and evaluation; `Trainer` runs them.

In the spirit of Lightning Fabric and accelerate, an app keeps a short top-down ``train`` and the harness
owns everything around the step. A run is set up before its model exists
([`Run`][app_common.run.Run]: threads, device, process group, seeding, the "finished earlier?" check),
and its trainer is built from the run and the model's parts, complete when constructed:

    run = Run.from_config(config, label=label)               # out, seed, device, ... from the config
    if (record := run.finished()) is not None:
        return record                                        # skip a finished run
    model = build(...).to(run.device)
    optimizer = torch.optim.AdamW(param_groups(model, config.weight_decay), lr=config.lr)
    warmup = schedule("cosine", config.warmup_steps, config.steps)
    trainer = Trainer.from_config(config, run, model, optimizer, schedule=warmup)  # steps, ... too
    trainer.fit(lambda step, batch: F.cross_entropy(trainer.forward(batch[0]), batch[1]),
                data=TrainData(train_set, config.batch_size, collate), evaluate=lambda step: {...})
    return trainer.finish(trainer.record(config, metrics={...}, details={...}))

What the harness does, in order, for every run:

1. **Set-up** ([`Run.from_config`][app_common.run.Run.from_config], then `Trainer.from_config`, the one
   way every app builds its run and trainer): CPU threads, the device (``--device``), the process group
   under ``torchrun``, seeding everything with ``seed`` (before the app builds its model); then the model
   compiled (``compile``) and wrapped in DistributedDataParallel under ``torchrun``.
2. **Resume** (`Trainer.fit`, the apps' one policy): the run's ``train.lock`` is taken first, so that a second
   process started on the same run is refused while this one trains it; with ``resume`` on and
   ``runs/<name>/checkpoint.pt`` saved under the same identity, the model, optimizers, the app's extra
   ``state`` (stateful objects and ``torch.Generator``), every process's random state and the counters are
   loaded and the log is cut back to the checkpoint's step; a checkpoint of another identity is refused,
   listing the changed settings. A checkpoint saved by another number of processes is refused too (the
   changed-world-size rule: resume with as many processes as saved it). A fresh run seeds its training stream
   with ``7919 seed + 17 + rank`` (dropout), so the stream of a resumed run equals the unbroken run's.
3. **Steps** ``t = start .. steps - 1``: the learning rate of every group is its peak times
   ``schedule(t)``; the batch of step ``t`` is the ``t``-th of the resumable order
   ([`StepBatches`][app_common.batches.StepBatches]: a function of ``(seed, t)``); ``zero_grad``, the loss
   under autocast (``--dtype``), ``backward`` (``accumulate`` micro-batches, DDP synchronizing on the last
   only), the NaN policy, gradient clipping at ``grad_clip`` (0: none), the optimizer step. Optimizers
   that need a closure (L-BFGS) get one that computes the loss and its gradient, unclipped (their line
   search needs the true gradient).
4. **NaN policy**: the step's loss (averaged over processes) must be finite before the update;
   ``on_nan="raise"`` stops the run with an error naming the step, ``on_nan="stop"`` ends training there
   and records ``diverged_at`` (the 0-based step whose loss was not finite; the update is not applied).
5. **Cadence**: every ``log_every`` steps (and the last) a log line with the mean training loss of the
   window and the learning rate; every ``eval_every`` steps (and the last) the app's evaluation, its metrics
   logged, then a checkpoint; a checkpoint also every ``checkpoint_every`` steps and after the last step.
   The app's evaluation may call `Trainer.stop` (early stopping).
6. **Timing and record**: ``train_seconds`` counts the steps only (not evaluation, logging or checkpoints)
   and carries across resumes; `Trainer.record` builds the one record schema
   ([`make_record`][app_common.records.make_record]) and `Trainer.finish` writes it (main process only).

A run killed at any checkpoint and resumed therefore ends with the weights, optimizer state, log lines and
record (bar ``train_seconds`` and ``finished_at``) of the unbroken run.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

from app_common.batches import StepBatches
from app_common.checkpoint import rewind_log
from app_common.device import device_name
from app_common.distributed import all_gather_object, all_reduce, barrier
from app_common.measure import Timer, peak_memory, reset_peak_memory
from app_common.progress import progress
from app_common.records import make_record, write_identity, write_record
from app_common.results import append_jsonl
from app_common.run import Run, config_settings
from app_common.schedules import Schedule
from app_common.seeding import rng_state, seed_everything, set_rng_state

#: Optimizers whose ``step`` takes a closure that recomputes the loss (their line search).
CLOSURE_OPTIMIZERS: tuple[type[torch.optim.Optimizer], ...] = (torch.optim.LBFGS,)

#: The NaN policies of `Trainer`.
NAN_POLICIES = ("raise", "stop")

#: The arguments of `Trainer` that `Trainer.from_config` reads from the configuration's fields of the same
#: name and that every configuration has (``OptimizerFields``).
REQUIRED_CONFIG_SETTINGS = ("steps", "grad_clip")
#: All it reads: those, and the ones it takes where the configuration has them (``EvalFields``, ...).
CONFIG_SETTINGS = (*REQUIRED_CONFIG_SETTINGS, "log_every", "eval_every", "checkpoint_every")

#: ``loss_fn(step, batch) -> scalar loss``: ``batch`` is the step's batch of `TrainData`, or without data
#: the micro-batch index (``0 .. accumulate - 1``; 0 without accumulation).
LossFn = Callable[[int, Any], torch.Tensor]


def training_stream_seed(seed: int, rank: int) -> int:
    """The seed of the global random stream (dropout) during training: ``7919 seed + 17 + rank``."""
    return 7919 * seed + 17 + rank


@dataclass(frozen=True)
class TrainData:
    """A training set the harness draws its batches from, in the resumable order of `StepBatches`.

    Attributes:
        dataset: map-style dataset.
        batch_size: examples per step (split over the processes).
        collate: ``collate_fn`` of the ``DataLoader``.
        workers: ``DataLoader`` workers.
    """

    dataset: Dataset[Any]
    batch_size: int
    collate: Callable[[list[Any]], Any] | None = None
    workers: int = 0


def _save_stateful(part: Any) -> Any:
    return part.get_state() if isinstance(part, torch.Generator) else part.state_dict()


def _load_stateful(part: Any, state: Any) -> None:
    if isinstance(part, torch.Generator):
        part.set_state(state)
    else:
        part.load_state_dict(state)


def _phases(
    phases: Sequence[tuple[str, int]], optimizers: Mapping[str, torch.optim.Optimizer], steps: int
) -> list[tuple[str, int]]:
    """The phases given (checked against the optimizers and ``steps``), or the one optimizer's."""
    if phases:
        unknown = [name for name, _ in phases if name not in optimizers]
        if unknown:
            raise ValueError(f"phases: {unknown} name no optimizer; expected {sorted(optimizers)}")
        if sum(count for _, count in phases) != steps:
            raise ValueError(f"phases: {list(phases)} add up to other than steps={steps}")
        return list(phases)
    if len(optimizers) == 1:
        return [(next(iter(optimizers)), steps)]
    raise ValueError(f"phases: needed to run several optimizers ({sorted(optimizers)})")


class Trainer:
    """One run's training harness (see the module's documentation for the full policy).

    Built from the run and the model's parts, it is complete when constructed: `fit` trains, `record`
    and `finish` write the record.

    Args:
        run: the run (set up, and its model built on ``run.device``, before the trainer).
        model: the model, on ``run.device``.
        optimizers: one optimizer, or several by name (with ``phases``).
        steps: optimizer steps of the run (all phases together).
        phases: ``[(optimizer name, steps), ...]`` run one after the other (Adam, then L-BFGS); the
            steps must add up to ``steps``. Default: the one optimizer for every step.
        schedule: learning-rate factor of the step (`app_common.schedules.schedule`); None: the groups'
            learning rates as they are.
        state: further stateful parts the checkpoint carries (``state_dict``/``load_state_dict``
            objects and ``torch.Generator``), e.g. the app's counters or a ray generator.
        extra: plain values saved in every checkpoint (e.g. the model's configuration).
        compile: ``torch.compile`` the model.
        grad_clip: the gradient norm's bound (0: no clipping).
        log_every: steps between training-loss log lines.
        eval_every: steps between evaluations (None: only after the last step).
        checkpoint_every: steps between checkpoints besides those after evaluations (None or 0: none).
        on_nan: ``raise`` or ``stop`` (see the NaN policy).
        show_progress: draw a progress bar (on the main process).

    Attributes:
        forward: the module the loss calls (compiled, and wrapped in DistributedDataParallel under
            ``torchrun``).
        eval_forward: the same without the wrapper (for evaluation).

    Raises:
        ValueError: a bad argument, naming it (phases that name no optimizer or do not add up to
            ``steps`` among them).
    """

    def __init__(
        self,
        run: Run,
        model: torch.nn.Module,
        optimizers: torch.optim.Optimizer | Mapping[str, torch.optim.Optimizer],
        *,
        steps: int,
        phases: Sequence[tuple[str, int]] = (),
        schedule: Schedule | None = None,
        state: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
        compile: bool = False,
        grad_clip: float = 0.0,
        log_every: int = 10,
        eval_every: int | None = None,
        checkpoint_every: int | None = None,
        on_nan: str = "raise",
        show_progress: bool = True,
    ) -> None:
        from spectraformer_core import check_int

        check_int("steps", steps, minimum=1)
        check_int("log_every", log_every, minimum=1)
        if eval_every is not None:
            check_int("eval_every", eval_every, minimum=1)
        if checkpoint_every is not None:
            check_int("checkpoint_every", checkpoint_every, minimum=0)
        if on_nan not in NAN_POLICIES:
            raise ValueError(f"on_nan: expected one of {', '.join(NAN_POLICIES)}, got {on_nan!r}")
        if isinstance(grad_clip, bool) or not isinstance(grad_clip, int | float) or grad_clip < 0:
            raise ValueError(f"grad_clip: expected a number >= 0, got {grad_clip!r}")
        self.optimizers: dict[str, torch.optim.Optimizer] = (
            {"optimizer": optimizers} if isinstance(optimizers, torch.optim.Optimizer) else dict(optimizers)
        )
        self.phases: list[tuple[str, int]] = _phases(phases, self.optimizers, steps)
        self.run, self.model, self.steps, self.schedule = run, model, steps, schedule
        self.state, self.extra = dict(state or {}), dict(extra or {})
        self.grad_clip, self.log_every, self.eval_every = float(grad_clip), log_every, eval_every
        self.checkpoint_every = checkpoint_every or None
        self.on_nan, self.show_progress = on_nan, show_progress
        self.step = 0
        self.train_seconds = 0.0
        self.stopped: str | None = None
        self.diverged_at: int | None = None
        self.window: list[float] = []  # losses of the steps since the last log line
        self.metrics: dict[str, Any] = {}  # the last evaluation's metrics
        self._peaks = {name: [g["lr"] for g in o.param_groups] for name, o in self.optimizers.items()}
        self._restored = False
        forward: torch.nn.Module = torch.compile(model) if compile else model  # type: ignore[assignment]
        self.eval_forward = forward
        if run.dist.enabled:
            ids = [run.device.index] if run.device.type == "cuda" else None
            forward = DistributedDataParallel(forward, device_ids=ids)
        self.forward = forward

    @classmethod
    def from_config(
        cls,
        config: Any,
        run: Run,
        model: torch.nn.Module,
        optimizers: torch.optim.Optimizer | Mapping[str, torch.optim.Optimizer],
        **arguments: Any,
    ) -> Trainer:
        """A trainer set from a configuration of the shared field groups: every app builds its trainer so.

        Each argument of ``CONFIG_SETTINGS`` comes from ``config``'s field of that name: ``steps`` and
        ``grad_clip`` always, ``log_every``, ``eval_every`` and ``checkpoint_every`` where ``config`` has
        them (else `Trainer`'s defaults). ``arguments`` replace any of these (steps counted from the data)
        or set the other arguments of `Trainer` (``phases``, ``schedule``, ``state``, ...).

        Raises:
            AttributeError: ``config`` lacks a field of ``REQUIRED_CONFIG_SETTINGS`` that ``arguments``
                does not give either.
        """
        optional = CONFIG_SETTINGS[len(REQUIRED_CONFIG_SETTINGS) :]
        settings = config_settings(config, REQUIRED_CONFIG_SETTINGS, optional, arguments)
        return cls(run, model, optimizers, **settings, **arguments)

    # ----------------------------------------------------------------------------------------- resume
    def restore(self) -> bool:
        """Load the run's checkpoint if there is one to resume (done by `fit`); True when loaded.

        The run is claimed first ([`Run.claim`][app_common.run.Run.claim]): a second process that
        trains the same run is refused; `fit` frees it when it returns.

        Raises:
            ValueError: a checkpoint of another identity, or saved by another number of processes.
            RuntimeError: another process trains the run now.
        """
        self.run.claim()
        if self._restored:
            return self.step > 0
        self._restored = True
        if self.run.is_main:
            write_identity(self.run.dir, self.run.checkpointer.identity)
        state = self.run.checkpointer.load(map_location=self.run.device)
        if state is None:
            if self.run.is_main:
                self.run.log_path.unlink(missing_ok=True)
            seed_everything(training_stream_seed(self.run.seed, self.run.dist.rank))
            return False
        saved_world = len(state["rng"])
        if saved_world != self.run.dist.world_size:
            raise ValueError(
                f"{self.run.checkpointer.path}: saved by {saved_world} processes; resume it with as many "
                f"(now {self.run.dist.world_size}), or pass --no-resume to start over"
            )
        self.model.load_state_dict(state["model"])
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state["optimizers"][name])
        for name, part in self.state.items():
            _load_stateful(part, state["state"][name])
        counters = state["counters"]
        self.step, self.train_seconds = int(state["step"]), float(counters["train_seconds"])
        self.stopped, self.diverged_at = counters["stopped"], counters["diverged_at"]
        self.window = list(counters["window"])
        self.metrics = dict(counters["metrics"])
        set_rng_state(state["rng"][self.run.dist.rank])
        if self.run.is_main:
            print(f"{self.run.name}: resuming at step {self.step} from {self.run.checkpointer.path}")
            rewind_log(self.run.log_path, self.step)
        barrier()
        return True

    def save(self) -> None:
        """Checkpoint the run now (every process takes part; the main one writes)."""
        rngs = all_gather_object(rng_state())
        counters = {
            "train_seconds": self.train_seconds,
            "stopped": self.stopped,
            "diverged_at": self.diverged_at,
            "window": list(self.window),
            "metrics": dict(self.metrics),
        }
        state = {
            "model": self.model.state_dict(),
            "optimizers": {name: o.state_dict() for name, o in self.optimizers.items()},
            "state": {name: _save_stateful(part) for name, part in self.state.items()},
            "counters": counters,
            "rng": rngs,
            **self.extra,
        }
        self.run.checkpointer.save(self.step, state, write=self.run.is_main)
        barrier()

    def stop(self, reason: str) -> None:
        """End training after the current evaluation (early stopping); ``reason`` goes to the record."""
        self.stopped = reason

    @property
    def done(self) -> bool:
        """True when there is no step left to take (budget spent, stopped or diverged)."""
        return self.stopped is not None or self.diverged_at is not None or self.step >= self.steps

    # -------------------------------------------------------------------------------------------- loop
    def _optimizer_at(self, step: int) -> tuple[str, torch.optim.Optimizer]:
        end = 0
        for name, count in self.phases:
            end += count
            if step < end:
                return name, self.optimizers[name]
        name = self.phases[-1][0]
        return name, self.optimizers[name]

    def _batches(self, data: TrainData) -> Iterator[Any]:
        loader = DataLoader(
            data.dataset,
            batch_sampler=StepBatches(
                len(data.dataset),  # type: ignore[arg-type]
                data.batch_size,
                seed=self.run.seed,
                start_step=self.step,
                rank=self.run.dist.rank,
                world_size=self.run.dist.world_size,
            ),
            collate_fn=data.collate,
            num_workers=data.workers,
            pin_memory=self.run.device.type == "cuda",
            # The iterator draws its base seed from this generator, not from the global stream (dropout),
            # so that the global stream is the same whether the loop starts fresh or resumes.
            generator=torch.Generator().manual_seed(self.run.seed),
        )
        return iter(loader)

    def _take_step(self, loss_fn: LossFn, step: int, batch: Any, accumulate: int) -> float:
        """One optimizer step; the loss averaged over micro-batches and processes (before the update)."""
        name, optimizer = self._optimizer_at(step)
        if self.schedule is not None:
            factor = self.schedule(step)
            for group, peak in zip(optimizer.param_groups, self._peaks[name], strict=True):
                group["lr"] = peak * factor
        if isinstance(optimizer, CLOSURE_OPTIMIZERS):

            def closure() -> torch.Tensor:
                optimizer.zero_grad(set_to_none=True)
                with self.run.autocast():
                    loss = loss_fn(step, batch)
                loss.backward()
                return loss

            first = cast(torch.Tensor, optimizer.step(closure))  # type: ignore[arg-type]  # a Tensor closure
            value = float(all_reduce(first.detach().float(), "mean").item())
            if not math.isfinite(value):
                self._diverged(step, value)
            return value
        optimizer.zero_grad(set_to_none=True)
        # One batch per process (its share of the global batch), or this process's share of the micro-batches.
        local = 1 if accumulate == 1 else accumulate // self.run.dist.world_size
        total = torch.zeros((), device=self.run.device)
        for i in range(local):
            micro = batch if accumulate == 1 else self.run.dist.rank + i * self.run.dist.world_size
            sync = i == local - 1 or not self.run.dist.enabled
            no_sync = contextlib.nullcontext() if sync else self.forward.no_sync()  # type: ignore[operator]
            with no_sync, self.run.autocast():
                loss = loss_fn(step, micro)
                if local > 1:
                    loss = loss / local
            loss.backward()
            total += loss.detach().float()
        value = float(all_reduce(total, "mean").item())
        if not math.isfinite(value):
            self._diverged(step, value)
            return value
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        optimizer.step()
        return value

    def _diverged(self, step: int, value: float) -> None:
        if self.on_nan == "raise":
            raise RuntimeError(f"{self.run.name}: the training loss became {value} at step {step + 1}")
        self.diverged_at = step

    def fit(
        self,
        loss_fn: LossFn,
        *,
        data: TrainData | None = None,
        accumulate: int = 1,
        evaluate: Callable[[int], Mapping[str, Any]] | None = None,
    ) -> None:
        """Train from the checkpoint's step (or 0) to ``steps`` (or until stopped or diverged).

        Args:
            loss_fn: ``(step, batch) -> loss`` (a scalar tensor); called under autocast.
            data: the training set whose batches the loss gets (None: the loss draws its own data, and
                gets the micro-batch index).
            accumulate: micro-batches per step, over all processes (a multiple of the world size); the
                loss of each is divided by their number on this process.
            evaluate: ``step -> metrics`` (plain numbers) at the evaluation cadence; may call `stop`. The
                last evaluation's metrics stay in `metrics` (and in the checkpoint).

        Raises:
            ValueError: a checkpoint that cannot be resumed, or ``accumulate`` not a multiple of the
                processes.
            RuntimeError: a non-finite loss under ``on_nan="raise"``, or another process trains the run
                now (its ``train.lock`` is held).
        """
        from spectraformer_core import check_int

        check_int("accumulate", accumulate, minimum=1)
        if accumulate > 1 and accumulate % self.run.dist.world_size:
            raise ValueError(
                f"accumulate: {accumulate} micro-batches are not divisible by the "
                f"{self.run.dist.world_size} processes"
            )
        if data is not None and accumulate != 1:
            raise ValueError("accumulate: micro-batches are drawn by the loss itself; pass data=None")
        try:
            self.restore()
            if not self.done:
                self._loop(loss_fn, data, accumulate, evaluate)
        finally:
            self.run.release()

    def _loop(
        self,
        loss_fn: LossFn,
        data: TrainData | None,
        accumulate: int,
        evaluate: Callable[[int], Mapping[str, Any]] | None,
    ) -> None:
        """`fit`'s step loop from `step` until done, stopped or diverged."""
        reset_peak_memory(self.run.device)
        batches = self._batches(data) if data is not None else None
        timer = Timer(self.run.device, elapsed=self.train_seconds)
        bar = progress(
            total=self.steps,
            initial=self.step,
            desc=self.run.name,
            leave=False,
            disable=not (self.run.is_main and self.show_progress),
        )
        window = self.window
        self.model.train()
        while not self.done:
            step = self.step
            batch = next(batches) if batches is not None else 0
            timer.start()
            value = self._take_step(loss_fn, step, batch, accumulate)
            self.train_seconds = timer.stop()
            if self.diverged_at is not None:
                bar.write(
                    f"{self.run.name}: the loss became {value} at step {step}; training stops (diverged)"
                )
                self.save()
                break
            self.step = step + 1
            window.append(value)
            bar.update(1)
            last = self.step == self.steps
            if self.step % self.log_every == 0 or last:
                mean = sum(window) / len(window)
                window.clear()
                bar.set_postfix(loss=f"{mean:.4g}")
                lr = self._optimizer_at(step)[1].param_groups[0]["lr"]
                if self.run.is_main:
                    append_jsonl(self.run.log_path, {"step": self.step, "train_loss": mean, "lr": lr})
            evaluated = evaluate is not None and (
                last or (self.eval_every is not None and self.step % self.eval_every == 0)
            )
            if evaluated:
                assert evaluate is not None
                self.metrics = dict(evaluate(self.step))
                self.model.train()
                if self.run.is_main:
                    append_jsonl(self.run.log_path, {"step": self.step, **self.metrics})
            every = self.checkpoint_every
            if evaluated or last or self.stopped or (every is not None and self.step % every == 0):
                self.save()
        bar.close()

    # ------------------------------------------------------------------------------------------ record
    def record(
        self,
        config: Any,
        *,
        metrics: Mapping[str, Any],
        details: Mapping[str, Any] | None = None,
        model: torch.nn.Module | None = None,
    ) -> dict[str, Any]:
        """The run's record in the one schema ([`make_record`][app_common.records.make_record]).

        Besides the core keys: ``steps``, ``stopped``, ``diverged_at``, ``world_size``, ``dtype``, and the
        peak memory (the largest over processes) with its kind.
        """
        model = model if model is not None else self.model
        peak = peak_memory(self.run.device)
        peak_bytes = int(all_reduce(torch.tensor([float(peak.bytes)], device=self.run.device), "max").item())
        return make_record(
            name=self.run.name,
            config=config,
            seed=self.run.seed,
            device=device_name(self.run.device),
            model=model,
            train_seconds=self.train_seconds,
            metrics=metrics,
            details=details,
            steps=self.step,
            stopped=self.stopped,
            diverged_at=self.diverged_at,
            world_size=self.run.dist.world_size,
            dtype=self.run.dtype,
            peak_memory_bytes=peak_bytes,
            memory_kind=peak.kind,
        )

    def finish(self, record: Mapping[str, Any], *, results: str | Path | None = None) -> dict[str, Any]:
        """Write ``record`` (results file, then ``record.json``) on the main process; returns it.

        Args:
            record: the run's record (`record`).
            results: the results file (default ``<out>/results.jsonl``).
        """
        if self.run.is_main:
            write_record(self.run.out, record, results=results)
        barrier()
        return dict(record)
