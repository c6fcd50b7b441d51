"""The apps' one vocabulary: flag meanings, the field groups configs compose, and a run's identity.

Every app spells the same thing with the same flag ([`FLAGS`][app_common.vocabulary.FLAGS]). A configuration
is a frozen, keyword-only dataclass that inherits the groups it needs, and redeclares a field with
[`option`][app_common.fields.option] where its default differs:

    @dataclass(frozen=True, kw_only=True)
    class TrainConfig(RuntimeFields, OptimizerFields, OutputFields):
        MAY_CHANGE_ON_RESUME = ("workers",)              # besides the groups' own
        lr: float = option("lr", 1e-2)                   # the vocabulary's help, this app's default
        workers: int = field(default=0, metadata={"help": "DataLoader workers"})

The apps' one run-identity scheme:

- A run's **identity** is every setting except those that do not change what it computes: where the data
  lives, ``out``, ``resume``, ``device``, ``threads``, ``compile``, ``workers``, logging, and how a grid is
  split (the ``MAY_CHANGE_ON_RESUME`` of the config's classes and of its nested groups), and a setting
  added after runs were recorded while it holds the value those runs had (``ADDED_SETTINGS``):
  [`run_identity`][app_common.fields.run_identity].
- A run's **name** (its folder ``<out>/runs/<name>/``) is a readable label, then eight hex digits of that
  identity: [`run_name`][app_common.fields.run_name] (``listops-softmax-f64-s0-937732f7``).
- A checkpoint resumes only under the same identity
  ([`Checkpointer`][app_common.checkpoint.Checkpointer]), refused with the changed keys otherwise.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from app_common.config import flag, flat_settings
from app_common.device import DTYPES
from app_common.vocabulary import FLAGS
from spectraformer_core import check_int


def option(name: str, default: Any = dataclasses.MISSING, *, help: str | None = None, **metadata: Any) -> Any:
    """A dataclass ``field`` for vocabulary flag ``name`` with this app's ``default``.

    Args:
        name: a key of [`FLAGS`][app_common.vocabulary.FLAGS] (its text is the help).
        default: the default (a tuple for a grid of values).
        help: what this app adds, after the vocabulary's text (``"<meaning>; <help>"``).
        **metadata: ``choices``, ``metavar``.

    Raises:
        KeyError: ``name`` is not in the vocabulary.
    """
    if name not in FLAGS:
        raise KeyError(f"name: {name!r} is not in the flag vocabulary; expected one of {', '.join(FLAGS)}")
    text = FLAGS[name] if help is None else f"{FLAGS[name]}; {help}"
    return field(default=default, metadata={"help": text, **metadata})


def check_int_fields(config: Any, *names: str, minimum: int = 1) -> None:
    """Each field ``names`` of ``config`` is an integer ``>= minimum`` (`spectraformer_core.check_int`).

    A grid field (a tuple) has each of its values checked. The error names the flag (``--batch-size``),
    the value and the range.

    Raises:
        ValueError: a field that is not such an integer.
    """
    for name in names:
        value = getattr(config, name)
        for item in value if isinstance(value, tuple) else (value,):
            check_int(flag(name), item, minimum)


def _check_number(name: str, value: Any, *, minimum: float, strict: bool) -> None:
    low_ok = value > minimum if strict else value >= minimum
    if isinstance(value, bool) or not isinstance(value, int | float) or not low_ok:
        relation = ">" if strict else ">="
        raise ValueError(f"--{name.replace('_', '-')}: expected a number {relation} {minimum}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class Fields:
    """The root of the field groups: ``__post_init__`` chains through every group's checks."""

    #: Settings of this class that may change when a run resumes (not part of its identity).
    MAY_CHANGE_ON_RESUME: ClassVar[tuple[str, ...]] = ()
    #: Settings added after runs were recorded, with the value those runs had: at that value a setting
    #: stays out of the identity, so the earlier runs keep their names and resume.
    ADDED_SETTINGS: ClassVar[Mapping[str, Any]] = {}

    def __post_init__(self) -> None:
        """Nothing at the root; each group checks its own fields and calls ``super().__post_init__()``."""


@dataclass(frozen=True, kw_only=True)
class RuntimeFields(Fields):
    """``--device``, ``--dtype``, ``--threads``: where and how precisely the run computes."""

    MAY_CHANGE_ON_RESUME: ClassVar[tuple[str, ...]] = ("device", "threads")

    device: str = option("device", "auto", metavar="auto|cpu|cuda[:i]")
    dtype: str = option("dtype", "float32", choices=tuple(DTYPES))
    threads: int = option("threads", 0)

    def __post_init__(self) -> None:
        """Check the three flags (the device itself is resolved when the run starts)."""
        super().__post_init__()
        if not isinstance(self.device, str) or not (
            self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")
        ):
            raise ValueError(f"--device: expected auto, cpu, cuda or cuda:<index>, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype: expected one of {', '.join(DTYPES)}, got {self.dtype!r}")
        check_int_fields(self, "threads", minimum=0)


@dataclass(frozen=True, kw_only=True)
class OptimizerFields(Fields):
    """``--steps``, ``--lr``, ``--grad-clip`` (the gradient's norm; 0: off). Apps set the defaults."""

    steps: int = option("steps", 1000)
    lr: float = option("lr", 1e-3)
    grad_clip: float = option("grad_clip", 1.0)

    def __post_init__(self) -> None:
        """Check the three flags (``lr`` may be None where the app fills it in, e.g. from a table)."""
        super().__post_init__()
        check_int_fields(self, "steps")
        if self.lr is not None:
            _check_number("lr", self.lr, minimum=0.0, strict=True)
        _check_number("grad_clip", self.grad_clip, minimum=0.0, strict=False)


@dataclass(frozen=True, kw_only=True)
class EvalFields(Fields):
    """``--eval-every``, ``--log-every``: how often the run evaluates and logs its training loss."""

    MAY_CHANGE_ON_RESUME: ClassVar[tuple[str, ...]] = ("log_every",)

    eval_every: int = option("eval_every", 100)
    log_every: int = option("log_every", 10)

    def __post_init__(self) -> None:
        """Both >= 1 (``eval_every`` may be None where the app fills it in)."""
        super().__post_init__()
        if self.eval_every is not None:
            check_int_fields(self, "eval_every")
        check_int_fields(self, "log_every")


@dataclass(frozen=True, kw_only=True)
class LayerFields(Fields):
    """``--layer``, ``--features``, ``--weight-matrix``: the MLP replacement and its budget."""

    layer: str = option("layer", "ralimp")
    features: int = option("features", 32)
    weight_matrix: str = option("weight_matrix", "base")

    def __post_init__(self) -> None:
        """``features`` >= 1 (its value, or each value of a grid)."""
        super().__post_init__()
        check_int_fields(self, "features")


@dataclass(frozen=True, kw_only=True)
class RaLiMPFields(Fields):
    """``--fit``, ``--num-atoms``: how a ``ralimp`` replacement fits its activation (RaLiMP's defaults).

    ``--fit paper`` with ``--num-atoms 1`` or more is the paper's layout (an atom in every layer);
    ``--fit variance`` (the default) may keep fewer atoms than ``--num-atoms`` (`ralimp.fits.choose_atoms`).
    The fit mode is checked where the layer is built (``ralimp.fits.FITS``).
    """

    fit: str = option("fit", "variance", metavar="variance|discretized|paper")
    num_atoms: int = option("num_atoms", 1)

    def __post_init__(self) -> None:
        """``num_atoms`` >= 0."""
        super().__post_init__()
        check_int_fields(self, "num_atoms", minimum=0)

    def ralimp_options(self, layer: str) -> dict[str, Any]:
        """``ralimp.create``'s keywords from this group for a ``layer`` replacement (none but ralimp's)."""
        return {"fit": self.fit, "num_atoms": self.num_atoms} if layer == "ralimp" else {}


@dataclass(frozen=True, kw_only=True)
class AttentionFields(Fields):
    """``--attention``, ``--attention-features``: the attention and its random-feature count."""

    attention: str = option("attention", "softmax")
    attention_features: int = option("attention_features", 128)

    def __post_init__(self) -> None:
        """``attention_features`` >= 1 (its value, or each value of a grid)."""
        super().__post_init__()
        check_int_fields(self, "attention_features")


@dataclass(frozen=True, kw_only=True)
class OutputFields(Fields):
    """``--out``, ``--resume``: where the run writes, and whether it continues its checkpoint."""

    MAY_CHANGE_ON_RESUME: ClassVar[tuple[str, ...]] = ("out", "resume")

    out: Path = option("out", Path("results"))
    resume: bool = option("resume", True)


def group_settings(config: Any, group: type) -> dict[str, Any]:
    """``config``'s values of the fields of field group ``group``, to pass on to another configuration.

    ``group_settings(quick, RuntimeFields)`` is ``{"device": ..., "dtype": ..., "threads": ...}``: a demo's
    runtime settings given to the runs it builds.
    """
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(group)}


def may_change_on_resume(config_or_class: Any) -> set[str]:
    """The settings of a configuration (class or instance) that may change on resume.

    The union of ``MAY_CHANGE_ON_RESUME`` over its classes (every base) and over its nested groups.
    """
    cls = config_or_class if isinstance(config_or_class, type) else type(config_or_class)
    names: set[str] = set()
    for klass in cls.__mro__:
        names.update(vars(klass).get("MAY_CHANGE_ON_RESUME", ()))
    if dataclasses.is_dataclass(cls):
        for f in dataclasses.fields(cls):
            value = None if isinstance(config_or_class, type) else getattr(config_or_class, f.name)
            if value is not None and dataclasses.is_dataclass(value):
                names.update(may_change_on_resume(value))
    return names


def added_settings(config_or_class: Any) -> dict[str, Any]:
    """The ``ADDED_SETTINGS`` of a configuration's classes (every base), the most derived winning."""
    cls = config_or_class if isinstance(config_or_class, type) else type(config_or_class)
    added: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        added.update(vars(klass).get("ADDED_SETTINGS", {}))
    return added


def run_identity(config: Any) -> dict[str, Any]:
    """A run's identity: every leaf setting of ``config`` except those that may change on resume.

    A setting of ``ADDED_SETTINGS`` at the value earlier runs had is left out too.
    """
    mutable, added = may_change_on_resume(config), added_settings(config)
    missing = object()
    return {k: v for k, v in flat_settings(config).items() if k not in mutable and added.get(k, missing) != v}


def identity_digest(identity: Mapping[str, Any]) -> str:
    """Eight hex digits of the SHA-256 of ``identity`` as JSON (keys sorted): the tail of a run's name."""
    text = json.dumps(dict(identity), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def run_name(label: str, identity: Mapping[str, Any]) -> str:
    """``<label>-<identity_digest(identity)>``: a run's name, the apps' one scheme.

    The label says what the run is to a reader (``listops-softmax-f64-s0``); the digest tells apart runs
    whose label is the same but whose identity differs, so that two configurations with one identity
    share a run folder and any other setting gives another.

    Raises:
        ValueError: an empty label, or one with ``/`` (it names a folder).
    """
    if not isinstance(label, str) or not label or "/" in label:
        raise ValueError(f"label: expected a non-empty run label without '/', got {label!r}")
    return f"{label}-{identity_digest(identity)}"
