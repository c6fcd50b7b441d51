"""``gpt-uptrain``: GPT-2 (nanoGPT-style) trained or uptrained with the MLPs of the last k blocks linearized.

Subcommands:

- ``prepare [FILES...] --out DIR --tokenizer char|byte|gpt2``: nanoGPT's train.bin/val.bin from text files;
- ``train --data DIR [--init-from HF_FOLDER] --mlp ralimp --last-k K``: one run (``torchrun`` for DDP);
- ``quick``: a small character-level model on Python's stdlib sources, dense and each replacement, on CPU;
- ``sample CHECKPOINT``: generate text from a run's checkpoint.pt or an HF GPT-2 folder (``--attention``);
- ``report RESULTS``: the validation perplexity table (Markdown, CSV) and the loss curves (PNG);
- ``kinds``: list the MLP replacements and the attention names.

Every setting is a flag and a key of the TOML file given with ``--config``; flags win.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import app_common as ac
from gpt_uptrain.config import PrepareConfig, QuickConfig, ReportConfig, SampleConfig, TrainConfig


def _with_toml(parser: argparse.ArgumentParser, cls: type, **kw) -> None:
    parser.add_argument("--config", type=Path, default=None, help="TOML file whose keys are the flags' names")
    ac.add_dataclass_arguments(parser, cls, **kw)


def _config(cls: type, args: argparse.Namespace):
    return ac.config_from(cls, args, toml=ac.read_toml(args.config) if args.config is not None else None)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``gpt-uptrain`` and its subcommands (``--help`` on each)."""
    parser = argparse.ArgumentParser(
        prog="gpt-uptrain",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name, cls, run, help_, kw in (
        ("prepare", PrepareConfig, _prepare, "tokenize text files into train.bin/val.bin", {}),
        ("train", TrainConfig, _train, "one training run", {}),
        ("quick", QuickConfig, _quick, "small offline comparison on CPU", {}),
        ("sample", SampleConfig, _sample, "generate text", {"positional": ("checkpoint",)}),
        ("report", ReportConfig, _report, "table and loss curves", {"positional": ("results",)}),
    ):
        sub = commands.add_parser(name, help=help_, description=cls.__doc__)
        if name == "prepare":
            sub.add_argument("files", nargs="*", type=Path, help="UTF-8 text files (none: the stdlib corpus)")
            kw = {"exclude": ("files",)}
        _with_toml(sub, cls, **kw)
        sub.set_defaults(run=run)
    kinds = commands.add_parser(
        "kinds", help="list MLP replacements and attentions", description="List names."
    )
    kinds.set_defaults(run=_kinds)
    return parser


def _prepare(args: argparse.Namespace) -> None:
    from gpt_uptrain.data import prepare, stdlib_files

    config = _config(PrepareConfig, args)
    files = list(args.files) or list(config.files)
    extra = {}
    if not files:
        files, extra = stdlib_files(config.stdlib_max_chars), {"corpus": "python-stdlib"}
    meta = prepare(
        files, config.out, tokenizer=config.tokenizer, val_fraction=config.val_fraction, extra_meta=extra
    )
    print(
        f"{config.out}: {meta['train_tokens']:,} train and {meta['val_tokens']:,} val tokens, "
        f"{meta['tokenizer']} tokenizer, vocabulary {meta['vocab_size']}, from {len(files)} files"
    )


def _train(args: argparse.Namespace) -> None:
    from gpt_uptrain.train import train

    train(_config(TrainConfig, args))


def _quick(args: argparse.Namespace) -> None:
    from gpt_uptrain.quick import quick

    config = _config(QuickConfig, args)
    print(quick(config))
    print(f"\nreport (table.md, table.csv, loss_curves.png): {Path(config.out) / 'report'}")


def _sample(args: argparse.Namespace) -> None:
    from gpt_uptrain.sample import sample

    for index, text in enumerate(sample(_config(SampleConfig, args))):
        print(f"--- sample {index}\n{text}")


def _report(args: argparse.Namespace) -> None:
    from gpt_uptrain.report import report

    config = _config(ReportConfig, args)
    print(report(config.results, config.out))


def _kinds(args: argparse.Namespace) -> None:
    import rf_attention
    from gpt_uptrain.model import MLP_OPTIONS

    print("MLP: dense, " + ", ".join(MLP_OPTIONS.names()))
    print("attention (those with a causal form; the others are refused): " + ", ".join(rf_attention.names()))


def main(argv: list[str] | None = None) -> int:
    """Run ``gpt-uptrain`` with ``argv`` (default: the command line); errors exit with status 2."""
    return ac.run_cli(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
