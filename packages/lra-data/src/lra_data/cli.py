"""``lra-data``: convert the LRA data sets into caches, generate offline ones, and describe a cache.

Subcommands:

- ``lra-data prepare --task T --source PATH --out DIR``: read the downloaded files once into ``DIR/T``;
- ``lra-data generate --task {listops,pathfinder} --n N --out DIR``: the same cache format, generated;
- ``lra-data info DIR``: print the manifest(s) of the cache(s) in ``DIR`` (``--verify``: re-check checksums).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any, TypeVar

from lra_data.cache import MANIFEST, LRADataset, read_manifest
from lra_data.datasets import GENERATORS, GenerateConfig, PrepareConfig, generate, prepare
from lra_data.errors import CacheError
from lra_data.listops import ListOpsConfig
from lra_data.pathfinder import PathfinderConfig
from lra_data.tasks import TASKS

_GENERATOR_CONFIGS = {"listops": ListOpsConfig, "pathfinder": PathfinderConfig}


_CROSS_REFERENCE = re.compile(r"\[`([^`]+)`\]\[[\w.]*\]")
_CODE = re.compile(r"``([^`]+)``|`([^`]+)`")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def help_text(doc: str | None) -> str:
    """A docstring as plain ``--help`` text: its lines kept, cross-references and code quotes dropped.

    ``[`TASKS`][lra_data.TASKS]`` becomes ``TASKS`` and ``` ``x`` ``` or ``` `x` ``` becomes ``x``; the
    indentation is removed as ``inspect.cleandoc`` does, so an ``Attributes:`` block stays one field a line.
    """
    text = _CROSS_REFERENCE.sub(r"\1", inspect.cleandoc(doc or ""))
    return _CODE.sub(lambda match: match.group(1) or match.group(2), text)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``lra-data`` (``--help`` on it and on each subcommand)."""
    parser = argparse.ArgumentParser(prog="lra-data", description=help_text(__doc__.splitlines()[0]))
    commands = parser.add_subparsers(dest="command", required=True, metavar="{prepare,generate,info}")

    p = commands.add_parser(
        "prepare",
        help="convert downloaded files into a cache",
        description=help_text(PrepareConfig.__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--task", required=True, choices=TASKS)
    p.add_argument("--source", required=True, type=Path, help="the downloaded data (folder)")
    p.add_argument("--out", required=True, type=Path, help="cache root; the cache goes to OUT/TASK")
    p.add_argument("--format", default="auto", choices=("auto", "release", "pickle"))
    p.add_argument("--pickle-prefix", default=None, help="the TASK part of TASK.{train,dev,test}.pickle")
    p.add_argument(
        "--difficulty", default="hard", help="pathfinder: easy, intermediate, hard or a folder name"
    )
    p.add_argument("--split-seed", type=int, default=0, help="pathfinder: seed of the 80/10/10 split")
    p.add_argument("--image-size", type=int, default=32, help="pathfinder: image side in pixels")
    p.add_argument("--overwrite", action="store_true", help="replace an existing cache")
    p.set_defaults(run=_prepare)

    g = commands.add_parser(
        "generate",
        help="generate a ListOps or Pathfinder cache offline",
        description=help_text(GenerateConfig.__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g.add_argument("--task", required=True, choices=tuple(GENERATORS))
    g.add_argument("--n", required=True, type=int, help="training examples")
    g.add_argument("--out", required=True, type=Path, help="cache root; the cache goes to OUT/TASK")
    g.add_argument("--val", type=int, default=None, help="validation examples (default: max(1, n // 10))")
    g.add_argument("--test", type=int, default=None, help="test examples (default: max(1, n // 10))")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--overwrite", action="store_true", help="replace an existing cache")
    for task, config in _GENERATOR_CONFIGS.items():
        group = g.add_argument_group(f"{task} generator (fields of {config.__name__})")
        for f in dataclasses.fields(config):
            group.add_argument(
                _flag(f.name),
                dest=f"{task}.{f.name}",
                type=type(f.default),
                default=None,
                metavar=f.name.upper(),
                help=f"default {f.default}",
            )
    g.set_defaults(run=_generate)

    i = commands.add_parser(
        "info", help="print the manifest of a cache", description="Print the manifest(s) as JSON."
    )
    i.add_argument("folder", type=Path, help="a cache folder, or a root holding one folder per task")
    i.add_argument("--verify", action="store_true", help="re-check every file's size, offsets and SHA-256")
    i.set_defaults(run=_info)
    return parser


_Config = TypeVar("_Config")


def _config_from_args(cls: type[_Config], args: argparse.Namespace, **given: Any) -> _Config:
    """``cls`` (a dataclass) with each field from the flag of its name; ``given`` fields as they are."""
    fields = [f.name for f in dataclasses.fields(cls) if f.name not in given]  # type: ignore[arg-type]
    return cls(**{name: getattr(args, name) for name in fields}, **given)


def _prepare(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    config = _config_from_args(PrepareConfig, args)
    _report(prepare(config), config.out / config.task)


def _generate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    settings: dict[str, Any] = {}
    for task, generator in _GENERATOR_CONFIGS.items():
        given = {f.name: getattr(args, f"{task}.{f.name}") for f in dataclasses.fields(generator)}
        given = {k: v for k, v in given.items() if v is not None}
        if given and task != args.task:
            parser.error(
                f"{', '.join(map(_flag, given))}: options of the {task} generator, not of {args.task}"
            )
        settings[task] = generator(**given)
    config = _config_from_args(GenerateConfig, args, **settings)
    _report(generate(config), config.out / config.task)


def _report(manifest: dict[str, Any], folder: Path) -> None:
    print(f"{manifest['task']}: cache written to {folder}")
    for split, entry in manifest["splits"].items():
        lengths = ", ".join(f"{d['min']}..{d['max']} (mean {d['mean']})" for d in entry["lengths"])
        truncated = sum(entry["truncated"])
        print(f"  {split}: {entry['count']} examples, lengths {lengths}, {truncated} truncated")


def _info(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    folder = args.folder
    if (folder / MANIFEST).is_file():
        caches = {folder.name: folder}
    else:
        caches = {p.parent.name: p.parent for p in sorted(folder.glob(f"*/{MANIFEST}"))}
        if not caches:
            raise FileNotFoundError(f"{folder}: no {MANIFEST} there nor in its subfolders (not a cache)")
    manifests = {name: read_manifest(path) for name, path in caches.items()}
    if args.verify:
        for name, path in caches.items():
            for split in manifests[name]["splits"]:
                LRADataset(path, split, verify=True)
            print(f"{path}: verified {', '.join(manifests[name]['splits'])}", file=sys.stderr)
    out = next(iter(manifests.values())) if len(manifests) == 1 else manifests
    print(json.dumps(out, indent=2))


def main(argv: list[str] | None = None) -> int:
    """Run ``lra-data`` with ``argv`` (default: the command line); errors exit with status 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.run(args, parser)
    except (ValueError, CacheError, OSError, RuntimeError) as error:
        parser.exit(2, f"lra-data {args.command}: error: {error}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
