"""The apps' one run layout and one record schema, and "skip finished runs" as one function.

Every app writes a run under ``<out>/runs/<name>/``:

- ``checkpoint.pt``: the resumable state ([`Trainer`][app_common.harness.Trainer]), kept when the run ends;
- ``log.jsonl``: one line per logged step (``train_loss``, ``lr``) and per evaluation (its metrics);
- ``identity.json``: the run's identity (what its name's digest stands for), written when training starts,
  so that an unfinished run says what it is without its checkpoint;
- ``record.json``: the run's record, written last; its presence means the run finished;
- ``train.lock``: held by the process that trains the run, so that a second one is refused.

and appends the same record as one line to the results file (``<out>/results.jsonl`` unless the app's
``--results`` names another). A record has the core keys of `CORE_KEYS`, the run's headline numbers under
``metrics`` and what only this app reports under ``details``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from app_common.config import config_dict
from app_common.results import append_jsonl

#: Keys every record has, in every app.
CORE_KEYS = (
    "name",
    "config",
    "seed",
    "device",
    "torch",
    "num_parameters",
    "trainable_parameters",
    "train_seconds",
    "finished_at",
    "metrics",
    "details",
)

RUNS = "runs"
CHECKPOINT = "checkpoint.pt"
LOG = "log.jsonl"
IDENTITY = "identity.json"
RECORD = "record.json"
LOCK = "train.lock"
RESULTS = "results.jsonl"


def run_dir(out: str | Path, name: str) -> Path:
    """``<out>/runs/<name>``: the folder of run ``name``."""
    if not name or "/" in name:
        raise ValueError(f"name: expected a run name without '/', got {name!r}")
    return Path(out) / RUNS / name


def report_folder(results: str | Path, report_dir: str | Path | None = None) -> Path:
    """The folder a report of ``results`` is written to: ``report_dir``, or ``report/`` beside ``results``."""
    return Path(report_dir) if report_dir is not None else Path(results).parent / "report"


def finished_record(out: str | Path, name: str) -> dict[str, Any] | None:
    """The record of run ``name`` under ``out`` if it finished (its ``record.json``), else None.

    The one "skip finished runs" test of the apps: sweeps and grids skip a run for which this is not None.
    """
    path = run_dir(out, name) / RECORD
    if not path.is_file():
        return None
    return dict(json.loads(path.read_text(encoding="utf-8")))


def make_record(
    *,
    name: str,
    config: Any,
    seed: int,
    device: str,
    model: torch.nn.Module,
    train_seconds: float,
    metrics: Mapping[str, Any],
    details: Mapping[str, Any] | None = None,
    **core: Any,
) -> dict[str, Any]:
    """A record with the core keys (`CORE_KEYS`); ``core`` adds harness-level keys (steps, memory, ...).

    Args:
        name: the run's name (its folder under ``runs/``).
        config: the run's configuration (a dataclass instance, stored as plain values, or a dict).
        seed: the run's seed.
        device: the device's name (``app_common.device.device_name``).
        model: the trained model (parameters counted: all, and those that train).
        train_seconds: wall-clock seconds of the training steps (not evaluation or checkpoints).
        metrics: the run's headline numbers (accuracy, perplexity, PSNR, MSE).
        details: what only this app reports (per-layer numbers, throughput, the layers replaced).
        **core: further top-level keys the harness adds (``steps``, ``stopped``, peak memory).
    """
    plain = config if isinstance(config, Mapping) else config_dict(config)
    return {
        "name": name,
        "config": dict(plain),
        "seed": seed,
        "device": device,
        "torch": torch.__version__,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "train_seconds": float(train_seconds),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **core,
        "metrics": dict(metrics),
        "details": dict(details or {}),
    }


def write_record(out: str | Path, record: Mapping[str, Any], *, results: str | Path | None = None) -> Path:
    """Append ``record`` to the results file, then write the run's ``record.json`` (the run is finished).

    Args:
        out: the folder holding ``runs/``.
        record: a record of `make_record`.
        results: the results file (default ``<out>/results.jsonl``).

    Returns:
        The path of ``record.json``.
    """
    append_jsonl(Path(out) / RESULTS if results is None else results, dict(record))
    return _write_json(run_dir(out, record["name"]) / RECORD, json.dumps(dict(record), default=str))


def write_identity(folder: str | Path, identity: Mapping[str, Any]) -> Path:
    """Write ``identity`` to ``<folder>/identity.json`` (a run's folder) and return its path."""
    return _write_json(Path(folder) / IDENTITY, json.dumps(dict(identity), sort_keys=True))


def read_identity(path: str | Path) -> dict[str, Any] | None:
    """The identity `write_identity` wrote to ``path``, or None when there is none (an older run folder)."""
    path = Path(path)
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _write_json(path: Path, text: str) -> Path:
    """Write one line of JSON ``text`` to ``path`` through a temporary and a rename (never half written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def flat_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """A record with its ``metrics`` and ``details`` lifted to the top level, for tables and reports."""
    flat = {k: v for k, v in record.items() if k not in ("metrics", "details")}
    return {**flat, **record.get("details", {}), **record.get("metrics", {})}
