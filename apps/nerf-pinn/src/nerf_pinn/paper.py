"""The RaLiMP paper's coordinate-network results against ours: its statements, our records, one figure.

The paper (Sec. 4, the RQ3 paragraph) reports the PINN, SIREN and NeRF comparisons as plots (Fig. 5, 8, 9)
and a table (Table 12) whose values its text does not give; App. D.5, which should hold the settings, is a
heading. What the text states is a claim per family and the size reduction of RaLiMP, so the figure draws
those and nothing else of the paper's: `PAPER` holds them, each with where it stands.

Our side comes from the records a comparison writes (`nerf_pinn.experiment.compare`): `load_runs` reads
results files, ``record.json`` files and ``--out`` folders (every finished run under ``runs/``, each seed
included, and the ``log.jsonl`` of the unfinished ones), `variants` groups them by variant (mean over the
seeds, min and max), and `plot_paper_figure` draws the metric and the parameter count of every variant
next to the paper's statements.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app_common.fields import may_change_on_resume
from app_common.plots import pyplot, save_figure
from app_common.records import IDENTITY, LOG, RECORD, RESULTS, RUNS, flat_record, read_identity
from app_common.results import read_jsonl
from nerf_pinn.config import FAMILIES
from nerf_pinn.experiment import format_metric, layer_settings
from nerf_pinn.families import family_class
from nerf_pinn.layers import DENSE, KINDS


@dataclass(frozen=True)
class PaperResult:
    """What the RaLiMP paper states about one family, and where (section, figure, table)."""

    #: Where the paper shows the experiment: plots or a table whose values the text does not give.
    shown_in: str
    #: The paper's sentences about it, close to its words.
    statements: tuple[str, ...]
    #: RaLiMP's size relative to the dense model as the paper states it (1 - "N% smaller").
    ralimp_size: float
    #: The paper's claim that RaLiMP reaches the dense model's metric (drawn at our dense mean); None: none.
    dense_claim: str | None


#: The paper's statements per family. All of them stand in Sec. 4, the RQ3 paragraph ("We start by
#: targeting NeRF ..."); the settings it points to, App. D.5 ("Next we discuss the experimental details
#: for NeRF, SIREN and PINN networks."), end the appendix without details.
PAPER: dict[str, PaperResult] = {
    "pinn": PaperResult(
        shown_in="Fig. 5 Left and Fig. 9 (plots; the text gives no error values)",
        statements=(
            "RaLiMP closes the gap with the dense PINN while being 42% smaller",
            "EUGen and SNNK struggle to solve this (Burgers) equation",
        ),
        ralimp_size=1 - 0.42,  # "while being 42% smaller"
        dense_claim="RaLiMP closes the gap with the dense PINN",
    ),
    "siren": PaperResult(
        shown_in="Fig. 5 Right and Fig. 8 (plots; the text gives no PSNR values)",
        statements=(
            "RaLiMP replaces all feed-forward layers (Fig. 8)",
            "RaLiMP matches the performance of the dense model while being 50% smaller",
        ),
        ralimp_size=1 - 0.50,  # "while being 50% smaller"
        dense_claim="RaLiMP matches the dense model",
    ),
    "nerf": PaperResult(
        shown_in="Fig. 5 Middle and Table 12 (neither's values are in the text)",
        statements=(
            "RaLiMP gives the top average score across all 3D scenes",
            "while reducing model size by 30% and inference time by 23%",
        ),
        ralimp_size=1 - 0.30,  # "reducing model size by 30%"
        dense_claim=None,  # the claim is against SNNK and EUGen, not the dense model
    ),
}

#: The settings the figure's title names, per family (those of the paper's protocols).
TITLE_SETTINGS: dict[str, tuple[str, ...]] = {
    "pinn": ("depth", "width", "steps", "lbfgs_iterations", "lbfgs_tolerance_grad", "features", "replace"),
    "siren": ("size", "depth", "width", "steps", "lr", "features", "replace"),
    "nerf": ("depth", "width", "steps", "features", "replace"),
}

_RUN_NAME = re.compile(r"^(?P<kind>[a-z]+)(?:-s(?P<seed>\d+))?(?:-[0-9a-f]{8})?$")


@dataclass(frozen=True)
class Unfinished:
    """A run without a record: its variant, seed (None: the log's name does not say) and last logged step.

    ``label`` is its variant as `variant_label` names a finished run's, read from the run's identity
    (``identity.json`` beside its log); a log without one is taken for its kind's default variant.
    """

    kind: str
    label: str
    seed: int | None
    step: int
    train_loss: float
    source: Path


@dataclass(frozen=True)
class Variant:
    """One variant's finished seeds and its unfinished runs.

    ``values`` are the finite metrics of the finished seeds (``seeds`` in the same order); a seed whose
    loss became non-finite is in ``diverged_at`` (its 1-based step), one whose metric is not finite in
    ``not_finite``.
    """

    label: str
    kind: str
    seeds: tuple[int, ...] = ()
    values: tuple[float, ...] = ()
    diverged_at: tuple[int, ...] = ()
    not_finite: int = 0
    params: int | None = None
    inference_params: int | None = None
    unfinished: tuple[Unfinished, ...] = ()

    @property
    def finished(self) -> int:
        """The number of finished seeds."""
        return len(self.values) + len(self.diverged_at) + self.not_finite


def load_runs(paths: Iterable[str | Path]) -> tuple[list[dict[str, Any]], list[Unfinished]]:
    """The finished records (flat, `flat_record`) and the unfinished runs in ``paths``.

    Each path is a results file (JSON lines), a run's ``record.json``, a run's log (``log.jsonl`` in its
    run folder, or ``<kind>.log.jsonl`` as the repository's ``records/`` keep them), or an ``--out``
    folder: its ``runs/*/record.json`` (every seed, where ``results.jsonl`` holds only the last
    comparison's) and the ``log.jsonl`` of its runs without a record. A record given twice counts once.

    Raises:
        FileNotFoundError: a path that does not exist.
        ValueError: a folder without ``runs/``, or a log whose name does not say its variant.
    """
    records: dict[tuple[Any, ...], dict[str, Any]] = {}
    unfinished: list[Unfinished] = []

    def add(record: dict[str, Any]) -> None:
        records.setdefault((record["name"], record["seed"], record["finished_at"]), flat_record(record))

    for path in map(Path, paths):
        if path.is_dir():
            if not (path / RUNS).is_dir():
                raise ValueError(f"RESULTS: {path} is a folder without {RUNS}/; expected the --out of a run")
            for run in sorted((path / RUNS).iterdir()):
                if (run / RECORD).is_file():
                    add(json.loads((run / RECORD).read_text(encoding="utf-8")))
                elif (run / LOG).is_file():
                    unfinished.extend(_unfinished(run / LOG, run.name))
        elif not path.is_file():
            raise FileNotFoundError(f"RESULTS: {path}: no such file or folder")
        elif path.name == LOG or path.name.endswith(".log.jsonl"):
            name = path.parent.name if path.name == LOG else path.name.removesuffix(".log.jsonl")
            unfinished.extend(_unfinished(path, name))
        elif path.suffix == ".json":
            add(json.loads(path.read_text(encoding="utf-8")))
        else:
            for record in read_jsonl(path):
                add(record)
    # a log of a finished run (the repository keeps those too) is no unfinished run: its variant and seed
    # have a record (any seed, when the log's name gives none)
    labels = {(variant_label(r), r["seed"]) for r in records.values()}
    done = labels | {(label, None) for label, _ in labels}
    return list(records.values()), [u for u in unfinished if (u.label, u.seed) not in done]


def _unfinished(log: Path, name: str) -> list[Unfinished]:
    """The last training step logged in ``log`` of the run ``name`` (none logged: no entry).

    Its identity is ``identity.json`` in the run's folder, or ``<name>.identity.json`` beside a
    ``<name>.log.jsonl`` the repository keeps.
    """
    match = _RUN_NAME.match(name)
    if match is None or match["kind"] not in KINDS:
        raise ValueError(
            f"RESULTS: {log}: the run name {name!r} names no variant; expected <kind>[-s<seed>-<digest>] "
            f"with kind one of {', '.join(KINDS)}"
        )
    steps = [r for r in read_jsonl(log) if "train_loss" in r]
    if not steps:
        return []
    seed = None if match["seed"] is None else int(match["seed"])
    identity = read_identity(
        log.parent / IDENTITY if log.name == LOG else log.with_name(f"{name}.{IDENTITY}")
    )
    label = (
        match["kind"]
        if identity is None
        else _label(identity["family"], identity["kind"], identity.get("fit"))
    )
    last = steps[-1]
    return [Unfinished(match["kind"], label, seed, int(last["step"]), float(last["train_loss"]), log)]


def family_of(records: Sequence[dict[str, Any]]) -> str:
    """The one family of ``records``.

    Raises:
        ValueError: no records, or records of several families.
    """
    families = sorted({r["family"] for r in records})
    if len(families) != 1:
        raise ValueError(
            "RESULTS: expected the records of one family, got "
            + (", ".join(families) if families else "no finished record")
        )
    return families[0]


def variant_label(record: dict[str, Any]) -> str:
    """The variant of a record: its kind, and RaLiMP's fit where it is not the family's default."""
    return _label(record["family"], record["kind"], record["config"].get("fit"))


def _label(family: str, kind: str, fit: str | None) -> str:
    default = next(f.default for f in dataclasses.fields(FAMILIES[family]) if f.name == "fit")
    if kind != "ralimp" or fit in (None, default):
        return kind
    return "ralimp, paper layout" if fit == "paper" else f"ralimp, fit {fit}"


def check_comparable(records: Sequence[dict[str, Any]]) -> None:
    """Refuse records of different settings: a variant's seeds share all, the variants all but their layers'.

    Settings that may change on resume (threads, device, ``--out``, ...) and the seed are left out; a
    setting only some records have (added since) is not compared.

    Raises:
        ValueError: names the two runs and the settings in which they differ.
    """
    family = family_of(records)
    free = may_change_on_resume(FAMILIES[family]) | {"seed", "layer", "out", "resume"}
    first: dict[str, dict[str, Any]] = {}
    for record in records:
        label = variant_label(record)
        reference = first.setdefault(label, record)
        _check_pair(reference, record, free)
        _check_pair(records[0], record, free | set(layer_settings(None)))


def _check_pair(a: dict[str, Any], b: dict[str, Any], free: set[str]) -> None:
    shared = (set(a["config"]) & set(b["config"])) - free
    differ = sorted(k for k in shared if a["config"][k] != b["config"][k])
    if differ:
        changes = ", ".join(f"{k}: {a['config'][k]!r} vs {b['config'][k]!r}" for k in differ)
        raise ValueError(
            f"RESULTS: {a['name']} (seed {a['seed']}) and {b['name']} (seed {b['seed']}) ran different "
            f"settings ({changes}); expected one protocol per figure"
        )


def variants(
    records: Sequence[dict[str, Any]], unfinished: Sequence[Unfinished], metric: str
) -> list[Variant]:
    """The variants of ``records`` (and of the unfinished runs), in the order of `KINDS`.

    An unfinished run joins the variant of its label (`Unfinished`).
    """
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault(variant_label(record), []).append(record)
    out = {}
    for label, group in groups.items():
        group = sorted(group, key=lambda r: r["seed"])
        ok = [r for r in group if r["diverged_at"] is None and math.isfinite(r[metric])]
        out[label] = Variant(
            label=label,
            kind=group[0]["kind"],
            seeds=tuple(r["seed"] for r in ok),
            values=tuple(float(r[metric]) for r in ok),
            diverged_at=tuple(r["diverged_at"] + 1 for r in group if r["diverged_at"] is not None),
            not_finite=sum(r["diverged_at"] is None and not math.isfinite(r[metric]) for r in group),
            params=group[0]["params"],
            inference_params=group[0]["inference_params"],
        )
    for run in unfinished:
        variant = out.get(run.label, Variant(label=run.label, kind=run.kind))
        out[run.label] = dataclasses.replace(variant, unfinished=(*variant.unfinished, run))
    order = {kind: i for i, kind in enumerate(KINDS)}
    return sorted(out.values(), key=lambda v: (order[v.kind], v.label))


def _settings_line(record: dict[str, Any]) -> str:
    config = record["config"]
    keys = TITLE_SETTINGS[record["family"]]
    return ", ".join(f"{k.replace('_', ' ')} {config[k]}" for k in keys if k in config)


def _tick(variant: Variant, loss_metric: bool) -> str:
    """The x label of a variant: its name, seed count and what did not finish."""
    lines = [variant.label]
    if variant.values:
        count = len(variant.values)
        lines.append(f"{count} seed{'s' if count > 1 else ''}" + (" (min-max)" if count > 1 else ""))
    lines += [f"diverged at step {step}" for step in variant.diverged_at]
    if variant.not_finite:
        lines.append(f"{variant.not_finite} not finite")
    for run in variant.unfinished:
        seed = "" if run.seed is None else f" s{run.seed}"
        lines += [f"unfinished{seed}", f"at step {run.step}"] + ([] if loss_metric else ["(no metric yet)"])
    return "\n".join(lines)


def _draw_metric(ax: Any, groups: Sequence[Variant], cls: Any) -> None:
    """Each variant's metric: the mean over its finished seeds with min-max bars; unfinished runs hollow."""
    for x, variant in enumerate(groups):
        if variant.values:
            mean = sum(variant.values) / len(variant.values)
            err = [[mean - min(variant.values)], [max(variant.values) - mean]]
            ax.errorbar(x, mean, yerr=err, fmt="o", color="C0", capsize=4)
            ax.annotate(format_metric(mean), (x, mean), textcoords="offset points", xytext=(8, 0), fontsize=8)
        for run in variant.unfinished:
            value = cls.metric_from_loss(run.train_loss)
            if value is not None:
                ax.plot(x + 0.15, value, "o", mfc="none", color="C0")
                ax.annotate(
                    f"{format_metric(value)} (step {run.step})",
                    (x + 0.15, value),
                    textcoords="offset points",
                    xytext=(6, -10),
                    fontsize=7,
                )
    ax.errorbar([], [], yerr=[], fmt="o", color="C0", capsize=4, label="ours: mean over seeds, min-max")
    if any(cls.metric_from_loss(run.train_loss) is not None for v in groups for run in v.unfinished):
        ax.plot([], [], "o", mfc="none", color="C0", label="ours, unfinished: from its last training loss")
    ticks = [
        _tick(v, any(cls.metric_from_loss(r.train_loss) is not None for r in v.unfinished)) for v in groups
    ]
    ax.set_xticks(range(len(groups)), ticks, fontsize=7)
    ax.set_xlim(-0.5, len(groups) - 0.3)
    if cls.metric_lower_is_better:
        ax.set_yscale("log")
    ax.set_ylabel(cls.metric_label)


def _draw_size(ax: Any, groups: Sequence[Variant], dense: Variant | None) -> None:
    """Each recorded variant's trainable and inference parameters over the dense model's."""
    highest = 1.0
    if dense is not None and dense.params and dense.inference_params:
        for x, v in enumerate(groups):
            if v.params is not None and v.inference_params is not None:
                trainable, deployed = v.params / dense.params, v.inference_params / dense.inference_params
                first = v is dense
                ax.bar(x - 0.15, trainable, width=0.3, color="C0", label="ours: trainable" if first else None)
                ax.bar(x + 0.15, deployed, width=0.3, color="C2", label="ours: inference" if first else None)
                highest = max(highest, trainable, deployed)
    else:
        ax.text(0.5, 0.5, "no finished dense record: no ratio of ours", ha="center", transform=ax.transAxes)
    ticks = [v.label if v.params is not None else f"{v.label}\nno record" for v in groups]
    ax.set_xticks(range(len(groups)), ticks, fontsize=7)
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.set_ylim(0, 1.45 * highest)  # room for the legend above the bars
    ax.axhline(1.0, color="0.6", lw=0.8)
    ax.set_ylabel("parameters / dense")


def plot_paper_figure(
    records: Sequence[dict[str, Any]],
    unfinished: Sequence[Unfinished],
    path: str | Path,
) -> Path:
    """Paper vs ours for one family: the metric and the parameter count per variant; the PNG written.

    Left: the family's metric per variant, the mean over the finished seeds with min-max bars; an
    unfinished run (SIREN) as a hollow marker at the PSNR of its last training loss
    (`nerf_pinn.experiment.Family.metric_from_loss`), where the family has such a bound; the paper's
    claim that RaLiMP reaches the dense model as a star beside it, at our dense mean. Right: trainable and
    inference parameters over the dense model's, and the paper's stated RaLiMP size. Below: the paper's
    statements and where they stand.

    Args:
        records: flat finished records of one family (`load_runs`), at least one.
        unfinished: runs without a record (`load_runs`).
        path: the PNG file.
    """
    plt = pyplot()

    check_comparable(records)
    family = family_of(records)
    cls = family_class(family)
    paper = PAPER[family]
    groups = variants(records, unfinished, cls.metric)
    if not any(v.kind == "ralimp" for v in groups):  # the paper's side has a RaLiMP slot
        groups = sorted([*groups, Variant(label="ralimp", kind="ralimp")], key=lambda v: KINDS.index(v.kind))
    dense = next((v for v in groups if v.label == DENSE and v.values), None)
    ralimp_at = next(x for x, v in enumerate(groups) if v.kind == "ralimp")

    fig, (ax_metric, ax_size) = plt.subplots(1, 2, figsize=(11, 5.2), gridspec_kw={"width_ratios": [3, 2]})
    _draw_metric(ax_metric, groups, cls)
    if dense is not None and paper.dense_claim is not None:
        level = sum(dense.values) / len(dense.values)
        label = f"paper: {paper.dense_claim} (no number; drawn at our dense mean)"
        ax_metric.plot(ralimp_at - 0.15, level, "*", color="C3", ms=12, label=label)
    ax_metric.legend(fontsize=7, loc="best")
    _draw_size(ax_size, groups, dense)
    label = f"paper: RaLiMP {paper.ralimp_size:.2f} (stated size reduction)"
    ax_size.plot(ralimp_at, paper.ralimp_size, "*", color="C3", ms=12, label=label)
    ax_size.legend(fontsize=7, loc="upper center")

    fig.suptitle(f"{family.upper()}: paper vs ours ({_settings_line(records[0])})", fontsize=9)
    note = [f"Paper (RaLiMP, Sec. 4): {paper.shown_in}; App. D.5 gives no sizes or steps. It states:"]
    note += [f"  - {s}" for s in paper.statements]
    fig.text(0.01, 0.01, "\n".join(note), fontsize=7, va="bottom", family="monospace")
    return save_figure(fig, path, dpi=110, rect=(0, 0.05 + 0.025 * len(note), 1, 0.96))


def results_inputs(paths: Sequence[Path]) -> Path:
    """The results file the report folder goes beside: a folder's ``results.jsonl``, else the first path."""
    first = Path(paths[0])
    return first / RESULTS if first.is_dir() else first
