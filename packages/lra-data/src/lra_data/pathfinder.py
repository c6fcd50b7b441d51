"""A Pathfinder-style image generator: are the two dots joined by one dashed path?

Each image shows ``num_distractors + 2`` dashed curved paths that keep a distance from each other, and
two endpoint dots. In a positive image (label 1) the dots are the two ends of one path; in a negative
image (label 0) they sit on the starts of two different paths. Both classes have the same number of
paths and dots, so only following a path tells them apart, as in Linsley et al. (2018) that the LRA uses.
This is not the released generator (which draws longer, smoother paths of Gabor-like dashes); use it to run
the Pathfinder task with no download, not to report LRA numbers.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from spectraformer_core import check_int


@dataclass(frozen=True)
class PathfinderConfig:
    """Geometry of generated Pathfinder images (lengths in pixels, angles in radians).

    Attributes:
        size: images are ``size x size``.
        num_segments: dashes per path.
        segment_length: distance between consecutive points of a path.
        dash_fraction: drawn part of each segment (the rest is the gap).
        max_turn: each segment turns by an angle uniform in ``[-max_turn, max_turn]``.
        num_distractors: paths beyond the two that the dots sit on (a positive image gets one more
            distractor, so both classes show ``num_distractors + 2`` paths).
        spacing: the minimum distance between points of two different paths.
        margin: path points keep at least this distance from the border.
        dot_radius: radius of the endpoint dots.
        max_tries: placements tried per path before the whole image is drawn afresh.
    """

    size: int = 32
    num_segments: int = 6
    segment_length: float = 4.0
    dash_fraction: float = 0.5
    max_turn: float = 0.5
    num_distractors: int = 1
    spacing: float = 2.0
    margin: float = 1.5
    dot_radius: float = 1.5
    max_tries: int = 100

    def __post_init__(self) -> None:
        check_int("size", self.size, 8)
        check_int("num_segments", self.num_segments, 1)
        check_int("num_distractors", self.num_distractors, 0)
        check_int("max_tries", self.max_tries, 1)
        checks = {
            "segment_length": self.segment_length > 0,
            "dash_fraction": 0 < self.dash_fraction <= 1,
            "max_turn": 0 <= self.max_turn <= math.pi,
            "spacing": self.spacing >= 0,
            "margin": 0 <= self.margin < self.size / 2,
            "dot_radius": self.dot_radius >= 0,
        }
        expected = {
            "segment_length": "> 0",
            "dash_fraction": "in (0, 1]",
            "max_turn": "in [0, pi]",
            "spacing": ">= 0",
            "margin": "in [0, size / 2)",
            "dot_radius": ">= 0",
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}: expected {expected[name]}, got {getattr(self, name)}")


@dataclass
class PathfinderSample:
    """One generated image with its geometry.

    Attributes:
        image: ``uint8`` tensor ``(size, size)``, background 0, paths and dots 255.
        label: 1 if the dots are joined by one path, else 0.
        paths: the points of every path, ``(num_segments + 1, 2)`` arrays of ``(x, y)``; the dotted
            paths come first (one path in a positive image, two in a negative one).
        dots: the two dot centers ``(x, y)``.
    """

    image: torch.Tensor
    label: int
    paths: list[np.ndarray]
    dots: list[tuple[float, float]]


def _along(points: np.ndarray, step: float = 0.25) -> np.ndarray:
    """Points every ``step`` pixels along a polyline ``(k, 2)``."""
    out = [points[:1]]
    for a, b in itertools.pairwise(points):
        count = max(1, math.ceil(float(np.linalg.norm(b - a)) / step))
        t = np.arange(1, count + 1, dtype=np.float64)[:, None] / count
        out.append(a + t * (b - a))
    return np.concatenate(out)


def _near(points: np.ndarray, size: int, radius: float) -> np.ndarray:
    """Boolean ``(size, size)`` mask (rows = y) of the pixel centers within ``radius`` of any point."""
    grid = np.stack(np.meshgrid(np.arange(size), np.arange(size), indexing="xy"), axis=-1).reshape(-1, 2)
    d2 = ((grid[:, None, :] - points[None, :, :]) ** 2).sum(-1).min(axis=1)
    return np.asarray((d2 <= radius * radius).reshape(size, size))


def _place_path(g: torch.Generator, config: PathfinderConfig, taken: np.ndarray) -> np.ndarray | None:
    """A random path that keeps inside the margins and off ``taken`` pixels, or None after max_tries."""
    lo, hi = config.margin, config.size - 1 - config.margin
    for _ in range(config.max_tries):
        u = torch.rand(3 + config.num_segments, generator=g, dtype=torch.float64).tolist()
        point = np.array([lo + (hi - lo) * u[0], lo + (hi - lo) * u[1]])
        angle = 2 * math.pi * u[2]
        points = [point]
        for turn in u[3:]:
            angle += config.max_turn * (2 * turn - 1)
            point = point + config.segment_length * np.array([math.cos(angle), math.sin(angle)])
            if not (lo <= point[0] <= hi and lo <= point[1] <= hi):
                break
            points.append(point)
        if len(points) < config.num_segments + 1:
            continue
        path = np.stack(points)
        pixels = np.clip(np.rint(_along(path)), 0, config.size - 1).astype(np.int64)
        if not taken[pixels[:, 1], pixels[:, 0]].any():
            return path
    return None


def _render(config: PathfinderConfig, paths: list[np.ndarray], dots: list[tuple[float, float]]) -> np.ndarray:
    image = np.zeros((config.size, config.size), dtype=np.uint8)
    for path in paths:
        for a, b in itertools.pairwise(path):
            dash = _along(np.stack([a, a + config.dash_fraction * (b - a)]))
            pixels = np.clip(np.rint(dash), 0, config.size - 1).astype(np.int64)
            image[pixels[:, 1], pixels[:, 0]] = 255
    for dot in dots:
        image[_near(np.array([dot]), config.size, config.dot_radius)] = 255
    return image


def draw_pathfinder(
    label: int, generator: torch.Generator, config: PathfinderConfig | None = None
) -> PathfinderSample:
    """Draw one image of class ``label`` (1: the dots are joined, 0: they are not).

    Raises:
        ValueError: ``label`` not 0 or 1.
        RuntimeError: the paths did not fit after ``max_tries`` fresh images (too many or too long paths
            for the image size).
    """
    if label not in (0, 1):
        raise ValueError(f"label: expected 0 or 1, got {label!r}")
    config = config or PathfinderConfig()
    num_paths = config.num_distractors + 2
    for _ in range(config.max_tries):
        taken = np.zeros((config.size, config.size), dtype=bool)
        paths = []
        for _ in range(num_paths):
            path = _place_path(g=generator, config=config, taken=taken)
            if path is None:
                break
            paths.append(path)
            taken |= _near(_along(path, step=0.5), config.size, config.spacing)
        if len(paths) < num_paths:
            continue
        if label == 1:
            dots = [tuple(paths[0][0]), tuple(paths[0][-1])]
        else:
            dots = [tuple(paths[0][0]), tuple(paths[1][0])]
        dots = [(float(x), float(y)) for x, y in dots]
        image = torch.from_numpy(_render(config, paths, dots))
        return PathfinderSample(image=image, label=label, paths=paths, dots=dots)
    raise RuntimeError(
        f"draw_pathfinder: {num_paths} paths did not fit in {config.max_tries} images with {config}"
    )


def iter_pathfinder(
    n: int, *, seed: int, config: PathfinderConfig | None = None
) -> Iterator[PathfinderSample]:
    """Yield ``n`` samples one at a time; see [`generate_pathfinder`][lra_data.generate_pathfinder]."""
    check_int("n", n, 0)
    g = torch.Generator().manual_seed(seed)
    labels = (torch.randperm(n, generator=g) < n // 2).long().tolist()
    for label in labels:
        yield draw_pathfinder(label, g, config)


def generate_pathfinder(
    n: int, *, seed: int, config: PathfinderConfig | None = None
) -> list[tuple[torch.Tensor, int]]:
    """``n`` Pathfinder-style images ``(uint8 (size, size), label)``, half of them positive.

    The labels are a seeded random permutation of ``n // 2`` ones (and ``n - n // 2`` zeros); the same
    ``seed`` gives the same images on every run and machine.
    """
    return [(sample.image, sample.label) for sample in iter_pathfinder(n, seed=seed, config=config)]
