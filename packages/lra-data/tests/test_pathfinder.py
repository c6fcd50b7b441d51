import itertools

import numpy as np
import pytest
import torch

from lra_data import PathfinderConfig, draw_pathfinder, generate_pathfinder


def _min_distance(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)).min())


def _dense(path: np.ndarray) -> np.ndarray:
    """Points every 0.1 px along a polyline."""
    parts = [a + np.linspace(0, 1, 30)[:, None] * (b - a) for a, b in itertools.pairwise(path)]
    return np.concatenate(parts)


def test_images_are_32_by_32_uint8_with_binary_labels():
    samples = generate_pathfinder(6, seed=0)
    for image, label in samples:
        assert image.shape == (32, 32)
        assert image.dtype == torch.uint8
        assert label in (0, 1)
        assert image.max() == 255
        assert image.min() == 0


def test_half_of_the_images_are_positive():
    labels = [label for _, label in generate_pathfinder(20, seed=1)]
    assert sum(labels) == 10


def test_same_seed_gives_the_same_images_and_another_seed_others():
    a = generate_pathfinder(4, seed=2)
    b = generate_pathfinder(4, seed=2)
    c = generate_pathfinder(4, seed=3)
    assert all(torch.equal(x[0], y[0]) and x[1] == y[1] for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x[0], y[0]) for x, y in zip(a, c, strict=True))


def test_positive_images_put_both_dots_at_the_two_ends_of_one_path():
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        sample = draw_pathfinder(1, g)
        path = sample.paths[0]
        assert np.allclose(sample.dots[0], path[0])
        assert np.allclose(sample.dots[1], path[-1])


def test_negative_images_put_the_dots_on_two_different_paths_that_never_touch():
    g = torch.Generator().manual_seed(1)
    config = PathfinderConfig()
    for _ in range(5):
        sample = draw_pathfinder(0, g, config)
        first, second = sample.paths[0], sample.paths[1]
        assert np.allclose(sample.dots[0], first[0])
        assert np.allclose(sample.dots[1], second[0])
        assert _min_distance(_dense(first), _dense(second)) > config.spacing - 1.0


def test_both_classes_show_the_same_number_of_paths_and_two_lit_dots():
    g = torch.Generator().manual_seed(2)
    config = PathfinderConfig(num_distractors=2, num_segments=4)
    for label in (0, 1, 0, 1):
        sample = draw_pathfinder(label, g, config)
        assert len(sample.paths) == config.num_distractors + 2
        assert all(len(p) == config.num_segments + 1 for p in sample.paths)
        for x, y in sample.dots:
            assert sample.image[round(y), round(x)] == 255


def test_paths_are_dashed_with_gaps():
    g = torch.Generator().manual_seed(3)
    config = PathfinderConfig(dot_radius=0.0, num_distractors=0)
    sample = draw_pathfinder(1, g, config)
    path = sample.paths[0]
    # The middle of each gap (between the end of a dash and the next point) stays dark.
    gap_middles = path[:-1] + (0.5 + config.dash_fraction / 2) * (path[1:] - path[:-1])
    dark = [sample.image[round(y), round(x)] == 0 for x, y in gap_middles]
    assert sum(dark) >= len(dark) // 2


def test_generator_refuses_bad_labels_and_config_values():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="label: expected 0 or 1, got 2"):
        draw_pathfinder(2, g)
    with pytest.raises(ValueError, match=r"dash_fraction: expected in \(0, 1\], got 1.5"):
        PathfinderConfig(dash_fraction=1.5)


def test_paths_that_cannot_fit_raise_instead_of_looping():
    g = torch.Generator().manual_seed(0)
    config = PathfinderConfig(size=8, num_segments=20, segment_length=4.0, max_tries=3)
    with pytest.raises(RuntimeError, match="paths did not fit"):
        draw_pathfinder(1, g, config)
