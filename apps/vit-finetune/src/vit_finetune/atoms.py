r"""What an atom costs and buys in the replaced ViT blocks: `ralimp.analysis.atoms_table` at initialization.

`main` builds the model of ``vit-finetune train --layer ralimp`` at the defaults (those of the ``quick``
demo's RaLiMP run: ``vit-digits`` from random weights, k = 4, budget 32, seed 0) and calibrates it as the run
does, and prints the table: the squared bias one atom removes in each replaced ``fc1``, the
estimator variance it adds at the budget, and the atoms the variance-aware fit keeps::

    uv run --frozen --package vit-finetune python -m vit_finetune.atoms
"""

from __future__ import annotations

import ralimp
from app_common.seeding import seed_everything
from vit_finetune import data as vdata
from vit_finetune.config import TrainConfig
from vit_finetune.train import build, calibration_images
from vit_finetune.weights import MODELS


def replaced_layers(config: TrainConfig) -> list[tuple[str, ralimp.RaLiMP]]:
    """``(module path, layer)`` of every RaLiMP of the run ``config`` at initialization, on the CPU."""
    config = config.resolved()
    image_size = config.image_size or MODELS.get(config.model).config.image_size
    splits = vdata.load(config.data, config.data_path, image_size=image_size)
    fit_set = splits.split("train" if config.tune else "trainval")
    seed_everything(config.seed)  # as the run's harness does before it builds the model
    model, _, _ = build(
        config,
        splits.num_classes,
        calibration=lambda spec, size: calibration_images(fit_set, config, spec, size, "cpu"),
    )
    return ralimp.analysis.ralimp_layers(model)


def main() -> None:
    """Print the atoms table of ``vit-finetune train --layer ralimp`` at the defaults."""
    print(ralimp.analysis.atoms_table(replaced_layers(TrainConfig(layer="ralimp"))))


if __name__ == "__main__":
    main()
