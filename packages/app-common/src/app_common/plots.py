"""Figures of the apps' reports: pyplot on the non-interactive Agg backend, and the one way to save a figure.

matplotlib is imported only when a figure is drawn: this package does not depend on it; every app (and
the benchmarks) that draws figures declares it.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def pyplot() -> ModuleType:
    """``matplotlib.pyplot``, with the non-interactive Agg backend selected (no display needed).

    Raises:
        ImportError: matplotlib is not installed.
    """
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError(
            "drawing a figure needs matplotlib, which is not installed: every app that draws figures "
            "(and spectraformer-benchmarks) declares it as a dependency, so install the app's package, "
            "or matplotlib itself (pip install 'matplotlib>=3.8')"
        ) from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(
    figure: Figure,
    path: str | Path,
    *,
    dpi: int = 120,
    rect: tuple[float, float, float, float] | None = None,
) -> Path:
    """Lay out ``figure``, write it to ``path`` (its folder created), close it; returns the path.

    A figure without a layout engine of its own gets ``tight_layout`` (within ``rect``, the
    ``(left, bottom, right, top)`` box in figure coordinates, when given). A figure created with one
    (``layout="constrained"``) is laid out by it when saved and is not re-laid out: ``tight_layout`` would
    replace its engine (and refuse when the figure has a colorbar).

    Raises:
        ValueError: ``rect`` given for a figure with a layout engine of its own.
    """
    engine = figure.get_layout_engine()
    if engine is None:
        figure.tight_layout(rect=rect)
    elif rect is not None:
        raise ValueError(
            f"rect={rect}: a box for tight_layout, but the figure has its own layout engine "
            f"({type(engine).__name__}); expected rect=None"
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    import matplotlib.pyplot as plt  # (installed: ``figure`` is one of its figures)

    plt.close(figure)
    return path
