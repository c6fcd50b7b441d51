"""Frozen dataclass configurations whose fields are the command-line flags, one to one, and TOML keys.

A field ``batch_size: int | None = None`` becomes the flag ``--batch-size`` and the TOML key
``batch_size``. Values are taken in this order, later ones winning: the dataclass default, the TOML file,
the flags given on the command line. A field's ``metadata`` may carry ``help`` and ``choices``:

    @dataclass(frozen=True)
    class Config:
        lr: float = field(default=1e-3, metadata={"help": "peak learning rate"})

    add_dataclass_arguments(parser, Config)
    config = config_from(Config, parser.parse_args(), toml=read_toml("run.toml"))
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


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
    if hint in (int, float, str, bool, Path):
        return hint, False
    raise TypeError(f"unsupported field type {hint}: expected int, float, str, bool, Path, tuple or X | None")


def _field_types(cls: type) -> dict[str, tuple[type, bool]]:
    hints = typing.get_type_hints(cls)
    return {f.name: _unwrap(hints[f.name]) for f in dataclasses.fields(cls)}


def add_dataclass_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    exclude: tuple[str, ...] = (),
    positional: tuple[str, ...] = (),
) -> None:
    """Add one flag per field of the dataclass ``cls`` to ``parser``.

    Flags that are not given leave no attribute on the parsed namespace (``argparse.SUPPRESS``), so
    [`config_from`][app_common.config_from] can tell them from values given explicitly. Booleans get
    ``--x/--no-x``; tuple fields take one or more values (``--features 64 128``).

    Args:
        parser: a parser or argument group.
        cls: a dataclass.
        exclude: fields that get no flag.
        positional: fields given as positional arguments instead of flags.
    """
    types_ = _field_types(cls)
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        kind, many = types_[f.name]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        text = f.metadata.get("help", "")
        if not required:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            shown = " ".join(map(str, default)) if many else default
            text = f"{text} (default: {shown})" if text else f"default: {shown}"
        kwargs: dict[str, Any] = {"help": text, "default": argparse.SUPPRESS}
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = kind
            if many:
                kwargs["nargs"] = "+"
            if "choices" in f.metadata:
                kwargs["choices"] = f.metadata["choices"]
            kwargs["metavar"] = f.metadata.get("metavar", f.name.upper())
        if f.name in positional:
            kwargs.pop("default")
            parser.add_argument(f.name, **kwargs)
        else:
            parser.add_argument(flag(f.name), dest=f.name, required=required, **kwargs)


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


def config_from(
    cls: type[T],
    args: argparse.Namespace | Mapping[str, Any] | None = None,
    *,
    toml: Mapping[str, Any] | None = None,
    **fixed: Any,
) -> T:
    """An instance of the dataclass ``cls`` from its defaults, a TOML table and parsed flags.

    Args:
        cls: a dataclass.
        args: parsed flags (attributes that are not fields of ``cls`` are ignored).
        toml: a TOML table whose keys are field names (nested tables are ignored: callers read them).
        **fixed: values that win over both.

    Raises:
        ValueError: a TOML key that is no field of ``cls`` (listing the fields), or a value of the wrong
            type.
    """
    types_ = _field_types(cls)
    values: dict[str, Any] = {}
    for key, value in (toml or {}).items():
        if isinstance(value, dict):
            continue
        if key not in types_:
            raise ValueError(f"TOML key {key!r}: not a setting; expected one of {', '.join(types_)}")
        values[key] = _coerce(key, value, *types_[key])
    given = vars(args) if isinstance(args, argparse.Namespace) else dict(args or {})
    values.update({k: _coerce(k, v, *types_[k]) for k, v in given.items() if k in types_})
    values.update(fixed)
    return cls(**values)


def config_dict(config: Any) -> dict[str, Any]:
    """A dataclass instance as a JSON- and TOML-friendly dict (paths as strings, tuples as lists)."""

    def plain(value: Any) -> Any:
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, tuple | list):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return {f.name: plain(getattr(config, f.name)) for f in dataclasses.fields(config)}
