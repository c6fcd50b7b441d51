r"""What an atom costs and buys in the replaced GPT blocks: `ralimp.analysis.atoms_table` at initialization.

`main` builds the RaLiMP run of ``gpt-uptrain quick`` (4 blocks of width 128, the last 2 MLPs replaced at
budget 128, seed 1337, the stdlib corpus prepared under ``runs/gpt-uptrain-quick/data`` if it is not there)
and calibrates it as the run does, and prints the table: the squared bias one atom removes in each replaced
``c_fc``, the estimator variance it adds at the budget, and the atoms the variance-aware fit keeps::

    uv run --frozen --package gpt-uptrain python -m gpt_uptrain.atoms
"""

from __future__ import annotations

from pathlib import Path

import torch

import ralimp
from app_common.seeding import seed_everything
from gpt_uptrain.config import QuickConfig, TrainConfig
from gpt_uptrain.data import TokenData
from gpt_uptrain.quick import quick_data
from gpt_uptrain.train import build_model


def replaced_layers(config: TrainConfig) -> list[tuple[str, ralimp.RaLiMP]]:
    """``(module path, layer)`` of every RaLiMP of the run ``config`` at initialization, on the CPU."""
    seed_everything(config.seed)  # as the run's harness does before it builds the model
    return ralimp.analysis.ralimp_layers(build_model(config, TokenData(config.data), torch.device("cpu")))


def main() -> None:
    """Print the atoms table of the RaLiMP run of ``gpt-uptrain quick`` at its defaults."""
    quick = QuickConfig()
    data = quick_data(Path(quick.out) / "data", quick.corpus_chars)
    print(ralimp.analysis.atoms_table(replaced_layers(quick.run("ralimp", data))))


if __name__ == "__main__":
    main()
