"""``gpt-uptrain quick``: the whole pipeline offline, on a CPU, in a few minutes.

Prepares a character-level corpus from Python's own standard library sources (`stdlib_files`), then
trains a small GPT from scratch for each MLP kind (dense, then each replacement of the last ``last_k``
blocks; the settings of `QUICK_RUN`) with the same data, budget, seed and
validation batches, and writes the report (table and loss curves). Every run keeps its checkpoint, so an
interrupted ``quick`` continues where it stopped.
"""

from __future__ import annotations

import time
from pathlib import Path

from gpt_uptrain.config import QuickConfig
from gpt_uptrain.data import META, prepare, stdlib_files
from gpt_uptrain.report import report
from gpt_uptrain.train import train


def quick_data(data: Path, corpus_chars: int) -> Path:
    """The character-level stdlib corpus of ``corpus_chars`` characters in ``data`` (prepared once)."""
    if not (data / META).is_file():
        files = stdlib_files(corpus_chars)
        meta = prepare(files, data, tokenizer="char", extra_meta={"corpus": "python-stdlib"})
        print(
            f"corpus: {len(files)} stdlib files ({files[0].name} .. {files[-1].name}), {meta['vocab_size']} "
            f"characters, {meta['train_tokens']:,} train / {meta['val_tokens']:,} val tokens -> {data}"
        )
    return data


def quick(config: QuickConfig) -> str:
    """Run the quick comparison; returns the Markdown table (also in ``out/report/table.md``)."""
    out = Path(config.out)
    data = quick_data(out / "data", config.corpus_chars)
    start = time.perf_counter()
    for layer in config.layer:
        train(config.run(layer, data))
    print(f"quick: {time.perf_counter() - start:.0f} s of training and evaluation")
    return report(out / "results.jsonl", out / "report")
