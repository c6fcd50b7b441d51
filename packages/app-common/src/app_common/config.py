"""Frozen dataclass configurations whose fields are the command-line flags, one to one, and TOML keys.

A field ``batch_size: int | None = None`` becomes the flag ``--batch-size`` and the TOML key
``batch_size``. Values are taken in this order, later ones winning: the dataclass default, the TOML file,
the flags given on the command line. A field's ``metadata`` may carry ``help``, ``choices`` and
``metavar``. A field whose type is itself a dataclass (``model: ModelConfig``) is a nested group: its
fields are flags under their own names, and TOML gives them flat or in a ``[model]`` table:

    @dataclass(frozen=True)
    class Config:
        lr: float = field(default=1e-3, metadata={"help": "peak learning rate"})

    add_config_argument(parser)
    add_dataclass_arguments(parser, Config)
    args = parser.parse_args()
    config = config_from(Config, args, toml=read_config(args))
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from app_common.vocabulary import FLAGS

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


def flag(name: str) -> str:
    """The command-line flag of a field: ``batch_size`` -> ``--batch-size``."""
    return "--" + name.replace("_", "-")


def _unwrap(hint: Any) -> tuple[type, bool]:
    """``(element type, is a tuple field)`` of a field annotation; ``X | None`` counts as ``X``."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"unsupported field type {hint}: only X | None unions map onto a flag")
        return _unwrap(args[0])
    if origin is tuple:
        return typing.get_args(hint)[0], True
    if hint in (int, float, str, bool, Path) or dataclasses.is_dataclass(hint):
        return hint, False
    raise TypeError(
        f"unsupported field type {hint}: expected int, float, str, bool, Path, a tuple, X | None or a "
        "dataclass"
    )


def _field_types(cls: type) -> dict[str, tuple[type, bool]]:
    hints = typing.get_type_hints(cls)
    return {f.name: _unwrap(hints[f.name]) for f in dataclasses.fields(cls)}


def _is_group(kind: type) -> bool:
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def leaf_fields(cls: type) -> dict[str, tuple[dataclasses.Field[Any], type, bool, Any]]:
    """Every flag-carrying field of ``cls``, nested dataclasses flattened.

    Returns ``name -> (field, type, is a tuple, default)``.

    A field whose type is a dataclass (``model: ModelConfig``) contributes its own fields under their own
    names (``--dim``, not ``--model-dim``); names must therefore be unique across the nesting.

    Raises:
        TypeError: two nested fields with one name.
    """
    found: dict[str, tuple[dataclasses.Field[Any], type, bool, Any]] = {}
    types_ = _field_types(cls)
    for f in dataclasses.fields(cls):
        kind, many = types_[f.name]
        if _is_group(kind):
            default = _default(f)
            for name, (inner, inner_kind, inner_many, inner_default) in leaf_fields(kind).items():
                if name in found:
                    raise TypeError(f"{cls.__name__}: field {name!r} appears twice in the nesting")
                if default is not dataclasses.MISSING:
                    inner_default = getattr(default, name, inner_default)
                found[name] = (inner, inner_kind, inner_many, inner_default)
            continue
        if f.name in found:
            raise TypeError(f"{cls.__name__}: field {f.name!r} appears twice in the nesting")
        found[f.name] = (f, kind, many, _default(f))
    return found


def add_dataclass_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    exclude: tuple[str, ...] = (),
    positional: tuple[str, ...] = (),
) -> None:
    """Add one flag per field of the dataclass ``cls`` (nested dataclasses flattened) to ``parser``.

    Flags that are not given leave no attribute on the parsed namespace (``argparse.SUPPRESS``), so
    [`config_from`][app_common.config.config_from] can tell them from values given explicitly. Booleans get
    ``--x/--no-x``; tuple
    fields take one or more values (``--features 64 128``); a field's ``choices`` are listed in the help.

    Args:
        parser: a parser or argument group.
        cls: a dataclass.
        exclude: fields that get no flag.
        positional: fields given as positional arguments instead of flags.
    """
    for name, (f, kind, many, default) in leaf_fields(cls).items():
        if name in exclude:
            continue
        required = default is dataclasses.MISSING
        text = f.metadata.get("help", "")
        if required:  # checked by config_from, after the TOML file: its value satisfies the flag
            text = f"{text} (required: as a flag or a key of --config)" if text else "required"
        else:
            shown = " ".join(map(str, default)) if many and default is not None else default
            text = f"{text} (default: {shown})" if text else f"default: {shown}"
        kwargs: dict[str, Any] = {"help": text.replace("%", "%%"), "default": argparse.SUPPRESS}
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = kind
            if many:
                kwargs["nargs"] = "+"
            if "choices" in f.metadata:
                kwargs["choices"] = f.metadata["choices"]
            else:
                kwargs["metavar"] = f.metadata.get("metavar", name.upper())
        if name in positional:
            kwargs.pop("default")
            parser.add_argument(name, **kwargs)
        else:
            parser.add_argument(flag(name), dest=name, **kwargs)


def add_config_argument(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """The ``--config FILE`` flag every training command has: a TOML file whose keys are the flags' names.

    Args:
        parser: the subcommand's parser.
        help: what this app adds after the vocabulary's meaning (``"<meaning>; <help>"``).
    """
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help=FLAGS["config"] if help is None else f"{FLAGS['config']}; {help}",
    )


def read_toml(path: str | Path) -> dict[str, Any]:
    """The table of a TOML file.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file is not valid TOML, naming the path.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such TOML file")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path}: not valid TOML ({error})") from None


def read_config(args: argparse.Namespace) -> dict[str, Any]:
    """The TOML table of ``args.config``, or ``{}`` without one.

    See [`add_config_argument`][app_common.config.add_config_argument].
    """
    path = getattr(args, "config", None)
    return read_toml(path) if path is not None else {}


def split_toml(
    table: Mapping[str, Any], *classes: type, extra: tuple[str, ...] = (), source: object = "TOML"
) -> list[dict[str, Any]]:
    """The keys of ``table`` that belong to each dataclass of ``classes`` (a sweep's grid, its runs).

    A key belongs to every class that has such a field (or a nested group of that name); keys in
    ``extra`` are the caller's own tables (``[table6.<task>]``).

    Raises:
        ValueError: a key that belongs to none, naming ``source`` and listing the known keys.
    """
    known = [set(leaf_fields(cls)) | {f.name for f in dataclasses.fields(cls)} for cls in classes]
    unknown = sorted(set(table) - set(extra) - set().union(*known))
    if unknown:
        listed = ", ".join(sorted(set().union(*known)))
        raise ValueError(f"{source}: unknown keys {', '.join(unknown)}; expected some of {listed}")
    return [{k: v for k, v in table.items() if k in names} for names in known]


def _coerce(name: str, value: Any, kind: type, many: bool) -> Any:
    if value is None:
        return None
    if many:
        if not isinstance(value, list | tuple):
            value = [value]
        return tuple(_coerce(name, v, kind, False) for v in value)
    if kind is Path and isinstance(value, str):
        return Path(value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{name}: expected a {kind.__name__}, got {value!r}")
    return value


def _leaf_values(instance: Any) -> dict[str, Any]:
    """The leaf values of a dataclass instance, nested groups flattened, as they are (not made plain)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        out.update(_leaf_values(value) if _is_group(type(value)) else {f.name: value})
    return out


def _build(cls: type[T], values: Mapping[str, Any], fixed: Mapping[str, Any]) -> T:
    """``cls(**...)`` from flat ``values`` (leaf names); nested groups from them over their defaults."""
    types_ = _field_types(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        kind, _ = types_[f.name]
        if f.name in fixed:
            kwargs[f.name] = fixed[f.name]
        elif _is_group(kind):
            given = {k: v for k, v in values.items() if k in leaf_fields(kind)}
            default = _default(f)
            if given or default is dataclasses.MISSING:
                base = {} if default is dataclasses.MISSING else _leaf_values(default)
                kwargs[f.name] = _build(kind, {**base, **given}, {})
        elif f.name in values:
            kwargs[f.name] = values[f.name]
    return cls(**kwargs)


def config_from(
    cls: type[T],
    args: argparse.Namespace | Mapping[str, Any] | None = None,
    *,
    toml: Mapping[str, Any] | None = None,
    **fixed: Any,
) -> T:
    """An instance of the dataclass ``cls`` from its defaults, a TOML table and parsed flags.

    Nested dataclass fields take their values from the same flat flags and from either flat TOML keys
    or a TOML table named after the field (``[model]``).

    Args:
        cls: a dataclass.
        args: parsed flags (attributes that are not fields of ``cls`` are ignored).
        toml: a TOML table whose keys are field names (other nested tables are ignored: callers read them).
        **fixed: values of top-level fields that win over both.

    Raises:
        ValueError: a TOML key that is no field of ``cls`` (listing the fields), a value of the wrong
            type, or a required field (no default) given neither as a flag nor in the TOML table.
    """
    leaves = leaf_fields(cls)
    groups = {f.name for f in dataclasses.fields(cls) if _is_group(_field_types(cls)[f.name][0])}
    values: dict[str, Any] = {}
    for key, value in (toml or {}).items():
        if isinstance(value, dict):
            if key in groups:
                for inner, inner_value in value.items():
                    if inner not in leaves:
                        expected = ", ".join(leaves)
                        raise ValueError(f"TOML key {key}.{inner}: not a setting; expected one of {expected}")
                    values[inner] = _coerce(inner, inner_value, *leaves[inner][1:3])
            continue
        if key not in leaves:
            raise ValueError(f"TOML key {key!r}: not a setting; expected one of {', '.join(leaves)}")
        values[key] = _coerce(key, value, *leaves[key][1:3])
    given = vars(args) if isinstance(args, argparse.Namespace) else dict(args or {})
    values.update({k: _coerce(k, v, *leaves[k][1:3]) for k, v in given.items() if k in leaves})
    missing = [
        flag(name)
        for name, (_, _, _, default) in leaves.items()
        if default is dataclasses.MISSING and name not in values and name not in fixed
    ]
    if missing:
        raise ValueError(f"{', '.join(missing)} required: give it as a flag or as a key of the --config file")
    return _build(cls, values, fixed)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return config_dict(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def config_dict(config: Any) -> dict[str, Any]:
    """A dataclass instance as a JSON- and TOML-friendly dict.

    Paths become strings, tuples lists, nested dataclasses nested dicts.
    """
    return {f.name: _plain(getattr(config, f.name)) for f in dataclasses.fields(config)}


def flat_settings(config: Any) -> dict[str, Any]:
    """Every leaf setting of a (possibly nested) dataclass instance by field name, as plain values."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update(flat_settings(value))
        else:
            out[f.name] = _plain(value)
    return out
