"""``gpt-uptrain quick``: the whole pipeline offline, on a CPU, in a few minutes.

Prepares a character-level corpus from Python's own standard library sources
([`stdlib_files`][gpt_uptrain.stdlib_files]), then trains a small GPT from scratch for each MLP kind (dense,
then each replacement of the last ``last_k`` blocks) with the same data, budget, seed and validation batches,
and writes the report (table and loss curves). Every run keeps its checkpoint, so an interrupted ``quick``
continues where it stopped.
"""

from __future__ import annotations

import time
from pathlib import Path

from gpt_uptrain.config import QuickConfig, TrainConfig
from gpt_uptrain.data import META, prepare, stdlib_files
from gpt_uptrain.report import report
from gpt_uptrain.train import train


def quick(config: QuickConfig) -> str:
    """Run the quick comparison; returns the Markdown table (also in ``out/report/table.md``)."""
    out = Path(config.out)
    data = out / "data"
    if not (data / META).is_file():
        files = stdlib_files(config.corpus_chars)
        meta = prepare(files, data, tokenizer="char", extra_meta={"corpus": "python-stdlib"})
        print(
            f"corpus: {len(files)} stdlib files ({files[0].name} .. {files[-1].name}), {meta['vocab_size']} "
            f"characters, {meta['train_tokens']:,} train / {meta['val_tokens']:,} val tokens -> {data}"
        )
    results = out / "results.jsonl"
    start = time.perf_counter()
    for kind in config.kinds:
        run = TrainConfig(
            data=data,
            out=out / "runs" / kind,
            results=results,
            name=kind if kind == "dense" else f"{kind} (last {config.last_k})",
            resume=True,
            n_layer=config.n_layer,
            n_head=config.n_head,
            n_embd=config.n_embd,
            block_size=config.block_size,
            attention=config.attention,
            mlp=kind,
            last_k=None if kind == "dense" else config.last_k,
            mlp_features=config.mlp_features,
            batch_size=config.batch_size,
            gradient_accumulation_steps=config.gradient_accumulation_steps,
            max_iters=config.max_iters,
            warmup_iters=config.warmup_iters,
            learning_rate=config.learning_rate,
            min_lr=config.min_lr,
            eval_interval=config.eval_interval,
            eval_iters=config.eval_iters,
            log_interval=5,
            seed=config.seed,
            device=config.device,
            threads=config.threads,
        )
        train(run)
    print(f"quick: {time.perf_counter() - start:.0f} s of training and evaluation")
    return report(results, out / "report")
