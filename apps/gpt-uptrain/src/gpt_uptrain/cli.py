"""``gpt-uptrain``: GPT-2 (nanoGPT-style) trained or uptrained with the MLPs of the last k blocks linearized.

Subcommands:

- ``prepare [FILES...] --out DIR --tokenizer char|byte|gpt2``: nanoGPT's train.bin/val.bin from text files;
- ``train --data DIR [--weights HF_FOLDER] --layer ralimp --last-k K``: one run (``torchrun`` for DDP);
- ``quick``: a small character-level model on Python's stdlib sources, dense and each replacement, on CPU;
- ``linearize-attention``: a softmax teacher's attention (trained here, or ``--weights HF_FOLDER``) converted
  to each RF pair or learned map, plain and with sliding windows, over seeds: swap, swap + fine-tune,
  attention transfer + fine-tune at equal steps (``linearize`` is its deprecated old name);
- ``sample CHECKPOINT``: generate text from a run's checkpoint.pt or an HF GPT-2 folder (``--attention``);
- ``report RESULTS``: the validation perplexity table (Markdown, CSV) and the loss curves (PNG);
- ``list layers|attentions``: the MLP replacement kinds or the attention names (causal ones only work).

Every setting is a flag and a key of the TOML file given with ``--config``; flags win.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import ralimp
import rf_attention
from app_common.cli import add_command, add_list_command, app_parser, command_config, run_cli
from gpt_uptrain.config import PrepareConfig, QuickConfig, ReportConfig, SampleConfig, TrainConfig
from gpt_uptrain.linearize_attention import LinearizeAttentionConfig

#: ``gpt-uptrain list WHAT``: the names it prints.
LISTS = {
    "layers": ralimp.names,
    "attentions": rf_attention.names,
}


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``gpt-uptrain`` and its subcommands (``--help`` on each)."""
    parser, commands = app_parser("gpt-uptrain", __doc__)
    prepare = add_command(
        commands,
        "prepare",
        PrepareConfig,
        _prepare,
        help="tokenize text files into train.bin/val.bin",
        exclude=("files",),
    )
    prepare.add_argument("files", nargs="*", type=Path, help="UTF-8 text files (none: the stdlib corpus)")
    add_command(commands, "train", TrainConfig, _train, help="one training run", exclude=("vocab_size",))
    add_command(commands, "quick", QuickConfig, _quick, help="small offline comparison on CPU")
    add_command(
        commands,
        "linearize-attention",
        LinearizeAttentionConfig,
        _linearize_attention,
        help="convert a softmax teacher's attention to RF pairs or learned maps (the MLPs stay dense)",
    )
    add_command(
        commands,
        "linearize",
        LinearizeAttentionConfig,
        _deprecated_linearize,
        help="deprecated: the old name of linearize-attention",
    )
    add_command(commands, "sample", SampleConfig, _sample, help="generate text", positional=("checkpoint",))
    add_command(
        commands, "report", ReportConfig, _report, help="table and loss curves", positional=("results",)
    )
    add_list_command(commands, LISTS, help="list the MLP replacement kinds or the attention names")
    return parser


def _prepare(args: argparse.Namespace) -> None:
    from gpt_uptrain.data import prepare, stdlib_files

    config = command_config(args)
    files = list(args.files) or list(config.files)
    extra = {}
    if not files:
        files, extra = stdlib_files(config.stdlib_max_chars), {"corpus": "python-stdlib"}
    meta = prepare(
        files, config.data, tokenizer=config.tokenizer, val_fraction=config.val_fraction, extra_meta=extra
    )
    print(
        f"{config.data}: {meta['train_tokens']:,} train and {meta['val_tokens']:,} val tokens, "
        f"{meta['tokenizer']} tokenizer, vocabulary {meta['vocab_size']}, from {len(files)} files"
    )


def _train(args: argparse.Namespace) -> None:
    from gpt_uptrain.train import train

    train(command_config(args))


def _quick(args: argparse.Namespace) -> None:
    from gpt_uptrain.quick import quick

    config = command_config(args)
    print(quick(config))
    print(f"\nreport (table.md, table.csv, loss_curves.png): {Path(config.out) / 'report'}")


def _linearize_attention(args: argparse.Namespace) -> None:
    from gpt_uptrain.linearize_attention import linearize_attention

    print(linearize_attention(command_config(args)))


def _deprecated_linearize(args: argparse.Namespace) -> None:
    print("gpt-uptrain linearize is deprecated: it is now gpt-uptrain linearize-attention", file=sys.stderr)
    _linearize_attention(args)


def _sample(args: argparse.Namespace) -> None:
    from gpt_uptrain.sample import sample

    for index, text in enumerate(sample(command_config(args))):
        print(f"--- sample {index}\n{text}")


def _report(args: argparse.Namespace) -> None:
    from gpt_uptrain.report import report

    config = command_config(args)
    print(report(config.results, config.report_dir))


def main(argv: list[str] | None = None) -> int:
    """Run ``gpt-uptrain`` with ``argv`` (default: the command line); errors exit with status 2."""
    return run_cli(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
