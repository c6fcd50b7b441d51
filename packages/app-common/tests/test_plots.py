import sys

import pytest

from app_common.plots import pyplot, save_figure

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_pyplot_without_matplotlib_names_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    with pytest.raises(ImportError, match=r"needs matplotlib.*install the app's package"):
        pyplot()


def test_save_figure_creates_the_folder_writes_a_png_and_closes_the_figure(tmp_path):
    pytest.importorskip("matplotlib")
    plt = pyplot()
    assert plt.get_backend().lower() == "agg"
    figure, ax = plt.subplots(figsize=(2, 1.5))
    ax.plot([0, 1, 2], [1, 0, 1])
    target = tmp_path / "not" / "yet" / "there.png"
    path = save_figure(figure, str(target), dpi=50, rect=(0, 0, 1, 0.5))
    assert path == target
    assert ax.get_position().y1 <= 0.5  # laid out within rect
    assert target.read_bytes()[:8] == PNG_SIGNATURE
    assert figure.number not in plt.get_fignums()


def test_save_figure_keeps_a_constrained_layout_and_refuses_a_rect_for_it(tmp_path):
    pytest.importorskip("matplotlib")
    plt = pyplot()
    figure, ax = plt.subplots(figsize=(2, 1.5), layout="constrained")
    figure.colorbar(ax.imshow([[0.0, 1.0], [1.0, 0.0]]), ax=ax)  # tight_layout would refuse this figure
    with pytest.raises(ValueError, match=r"rect=\(0, 0, 1, 0.9\).*ConstrainedLayoutEngine"):
        save_figure(figure, tmp_path / "refused.png", rect=(0, 0, 1, 0.9))
    assert not (tmp_path / "refused.png").exists()
    save_figure(figure, tmp_path / "constrained.png")
    assert (tmp_path / "constrained.png").read_bytes()[:8] == PNG_SIGNATURE
    assert figure.number not in plt.get_fignums()
