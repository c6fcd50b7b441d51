r"""What an atom costs and buys in the single-layer fit: `ralimp.analysis.atoms_table` per activation.

`main` builds the ``ralimp`` method of the reduced protocol of the results page (2048 samples of width 256,
budget 32, seed 0, ``balance="auto"``) for each activation of Fig. 2, as ``layer-fit train`` builds it, and
prints the table: the squared bias one atom removes, the estimator variance it adds at the budget, and the
atoms the variance-aware fit keeps::

    uv run --frozen --package layer-fit python -m layer_fit.atoms
"""

from __future__ import annotations

import ralimp
from layer_fit.config import ACTIVATIONS, FitConfig
from layer_fit.data import make_data
from layer_fit.methods import build


def ralimp_layer(activation: str, config: FitConfig, *, budget: int = 32, seed: int = 0) -> ralimp.RaLiMP:
    """The ``ralimp`` method's layer of one run of ``config`` (as `layer_fit.fit_one` builds it)."""
    data = make_data(
        activation, samples=config.samples, dim=config.dim, seed=config.data_seed, center=config.center
    )
    model = build(
        "ralimp",
        activation,
        budget,
        dim=config.dim,
        seed=seed,
        sample=data.calibration_sample,
        balance=config.balance,
    )
    assert isinstance(model.layer, ralimp.RaLiMP)
    return model.layer


def main() -> None:
    """Print the atoms table of the reduced protocol's ``ralimp`` runs (2048 samples, budget 32, seed 0)."""
    config = FitConfig(samples=2048, threads=1)
    print(ralimp.analysis.atoms_table((a, ralimp_layer(a, config)) for a in ACTIVATIONS))


if __name__ == "__main__":
    main()
