"""Posed images for NeRF: the Blender synthetic and ``tiny_nerf_data.npz`` loaders, and an offline scene.

A `Scene` holds images ``(N, H, W, 3)`` in ``[0, 1]``, camera-to-world poses ``(N, 4, 4)`` (OpenGL
convention, as in both formats: the camera looks along its ``-z`` axis, ``y`` up), the focal length in
pixels, the near/far bounds, and which views train and which are held out.

The offline default (`render_synthetic_scene`) is a small scene of analytic shapes (spheres and a
box with known colours and constant densities) rendered from known poses on a sphere around it with the
same volume rendering equation the model uses, at many samples per ray, and written in the
``tiny_nerf_data.npz`` format, so training runs with no download.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from nerf_pinn.render import camera_rays, volume_render
from spectraformer_core import check_int


@dataclass(frozen=True)
class Scene:
    """Posed images and the split."""

    images: torch.Tensor
    poses: torch.Tensor
    focal: float
    near: float
    far: float
    train: list[int]
    test: list[int]

    def __post_init__(self) -> None:
        n = self.images.shape[0]
        if self.images.dim() != 4 or self.images.shape[-1] != 3:
            raise ValueError(f"images: expected (N, H, W, 3), got {tuple(self.images.shape)}")
        if tuple(self.poses.shape) != (n, 4, 4):
            raise ValueError(f"poses: expected ({n}, 4, 4), got {tuple(self.poses.shape)}")
        if not self.train or not self.test:
            raise ValueError(f"train, test: expected non-empty view lists, got {self.train} and {self.test}")
        if not 0 <= self.near < self.far:
            raise ValueError(f"near, far: expected 0 <= near < far, got {self.near}, {self.far}")

    @property
    def height(self) -> int:
        """Image height."""
        return self.images.shape[1]

    @property
    def width(self) -> int:
        """Image width."""
        return self.images.shape[2]


def load_tiny_nerf(path: str | Path, *, held_out: int = 4, near: float = 2.0, far: float = 6.0) -> Scene:
    """A ``tiny_nerf_data.npz`` file: ``images (N, H, W, 3)``, ``poses (N, 4, 4)``, ``focal``.

    The last ``held_out`` views are held out. ``near``/``far`` stored in the file (our synthetic scene
    writes them) win over the arguments.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no such file (expected tiny_nerf_data.npz with images, poses, focal)"
        )
    with np.load(path) as data:
        missing = {"images", "poses", "focal"} - set(data.files)
        if missing:
            raise ValueError(f"{path}: missing arrays {sorted(missing)} (expected images, poses, focal)")
        images = torch.tensor(np.asarray(data["images"], dtype=np.float32))
        poses = torch.tensor(np.asarray(data["poses"], dtype=np.float32))
        focal = float(np.asarray(data["focal"]).reshape(()))
        near = float(data["near"]) if "near" in data.files else near
        far = float(data["far"]) if "far" in data.files else far
    if images.max() > 1.0 + 1e-6:
        images = images / 255.0
    n = images.shape[0]
    if not 0 < held_out < n:
        raise ValueError(f"held_out: expected 1..{n - 1} views of {n}, got {held_out}")
    return Scene(images, poses, focal, near, far, list(range(n - held_out)), list(range(n - held_out, n)))


def load_blender(
    root: str | Path, *, downscale: int = 1, held_out: int | None = None, near: float = 2.0, far: float = 6.0
) -> Scene:
    """A Blender synthetic scene folder: ``transforms_{train,val,test}.json`` and their RGBA PNGs.

    Images are composited on a white background (as NeRF does for these scenes) and reduced by an integer
    ``downscale`` (box filter). Training uses the ``train`` frames, evaluation the first ``held_out`` of
    the ``test`` frames (all when None). ``val`` is read only to check the folder is complete.
    """
    from PIL import Image

    root = Path(root)
    check_int("downscale", downscale, 1)
    images, poses, splits, angle = [], [], {}, None
    for split in ("train", "val", "test"):
        meta_path = root / f"transforms_{split}.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{meta_path}: missing (expected a Blender synthetic scene folder)")
        meta = json.loads(meta_path.read_text())
        angle = float(meta["camera_angle_x"])
        if split == "val":
            continue
        frames = meta["frames"][:held_out] if split == "test" and held_out else meta["frames"]
        start = len(images)
        for frame in frames:
            file = root / (frame["file_path"] + ("" if frame["file_path"].endswith(".png") else ".png"))
            if not file.is_file():
                raise FileNotFoundError(f"{file}: image of {meta_path.name} missing")
            rgba = np.asarray(Image.open(file).convert("RGBA"), dtype=np.float32) / 255.0
            if downscale > 1:
                h, w = (s // downscale * downscale for s in rgba.shape[:2])
                rgba = (
                    rgba[:h, :w].reshape(h // downscale, downscale, w // downscale, downscale, 4).mean((1, 3))
                )
            images.append(rgba[..., :3] * rgba[..., 3:] + (1 - rgba[..., 3:]))
            poses.append(np.asarray(frame["transform_matrix"], dtype=np.float32))
        splits[split] = list(range(start, len(images)))
    width = images[0].shape[1]
    focal = 0.5 * width / math.tan(0.5 * angle)
    return Scene(
        torch.tensor(np.stack(images)),
        torch.tensor(np.stack(poses)),
        focal,
        near,
        far,
        splits["train"],
        splits["test"],
    )


def load_scene(path: str | Path, *, held_out: int, downscale: int = 1) -> Scene:
    """A Blender folder or a ``.npz`` file, by what ``path`` is."""
    path = Path(path)
    if path.is_dir():
        return load_blender(path, downscale=downscale, held_out=held_out)
    if path.suffix == ".npz":
        return load_tiny_nerf(path, held_out=held_out)
    raise FileNotFoundError(f"data: {path} is neither a Blender scene folder nor a .npz file")


# ------------------------------------------------------------------------------------ offline scene
#: The synthetic scene: (kind, centre, size, colour, density). Spheres have a radius, boxes half-sizes.
SHAPES = (
    ("sphere", (0.0, 0.0, 0.0), 0.55, (0.9, 0.2, 0.15), 30.0),
    ("sphere", (0.65, 0.45, 0.2), 0.3, (0.15, 0.35, 0.9), 8.0),
    ("box", (-0.55, -0.35, -0.2), (0.3, 0.25, 0.35), (0.2, 0.8, 0.3), 20.0),
)


def scene_field(points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Density ``(...)`` and colour ``(..., 3)`` of `SHAPES` at ``points (..., 3)``.

    Densities add where shapes overlap; the colour is the density-weighted mean of theirs.
    """
    sigma = torch.zeros(points.shape[:-1], dtype=points.dtype, device=points.device)
    weighted = torch.zeros_like(points)
    for kind, centre, size, colour, density in SHAPES:
        rel = points - torch.tensor(centre, dtype=points.dtype, device=points.device)
        if kind == "sphere":
            inside = rel.norm(dim=-1) <= size
        else:
            inside = (rel.abs() <= torch.tensor(size, dtype=points.dtype, device=points.device)).all(-1)
        s = density * inside.to(points.dtype)
        sigma = sigma + s
        weighted = weighted + s.unsqueeze(-1) * torch.tensor(colour, dtype=points.dtype, device=points.device)
    return sigma, weighted / sigma.clamp_min(1e-12).unsqueeze(-1)


def look_at_pose(position: torch.Tensor) -> torch.Tensor:
    """Camera-to-world ``(4, 4)`` of a camera at ``position`` looking at the origin, world ``z`` up."""
    forward = -position / position.norm()  # the camera looks along -z_cam = forward
    right = torch.linalg.cross(forward, torch.tensor([0.0, 0.0, 1.0], dtype=position.dtype))
    right = right / right.norm()
    up = torch.linalg.cross(right, forward)
    pose = torch.eye(4, dtype=position.dtype)
    pose[:3, 0], pose[:3, 1], pose[:3, 2], pose[:3, 3] = right, up, -forward, position
    return pose


def render_synthetic_scene(
    path: str | Path,
    *,
    num_views: int = 40,
    size: int = 32,
    radius: float = 4.0,
    near: float = 2.0,
    far: float = 6.0,
    samples: int = 256,
    seed: int = 0,
) -> Path:
    """Render `SHAPES` from ``num_views`` poses to the ``.npz`` file ``path``; returns ``path``.

    The file holds ``images``, ``poses``, ``focal`` (and ``near``, ``far``); black background, 40 degree
    field of view.

    Cameras sit at ``radius`` on a spiral over the upper hemisphere (elevations 15 to 60 degrees, azimuths
    by the golden angle), so held-out views lie between training views.
    """
    path = Path(path)
    check_int("num_views", num_views, 2)
    check_int("size", size, 4)  # pixels of the image side
    focal = 0.5 * size / math.tan(math.radians(20))
    images, poses = [], []
    golden = math.pi * (3 - math.sqrt(5))
    gen = torch.Generator().manual_seed(seed)
    for i in range(num_views):
        elevation = math.radians(15 + 45 * (i + 0.5) / num_views)
        azimuth = i * golden + 0.1 * float(torch.rand((), generator=gen))
        position = radius * torch.tensor(
            [
                math.cos(elevation) * math.cos(azimuth),
                math.cos(elevation) * math.sin(azimuth),
                math.sin(elevation),
            ],
            dtype=torch.float64,
        )
        pose = look_at_pose(position)
        origins, directions = camera_rays(size, size, focal, pose)
        t = near + (far - near) * (torch.arange(samples, dtype=torch.float64) + 0.5) / samples
        points = origins[..., None, :] + directions[..., None, :] * t[:, None]
        sigma, colour = scene_field(points)
        deltas = torch.full_like(sigma, (far - near) / samples) * directions.norm(dim=-1, keepdim=True)
        rgb, _, _ = volume_render(sigma, colour, deltas)
        images.append(rgb.float().numpy())
        poses.append(pose.float().numpy())
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        path, images=np.stack(images), poses=np.stack(poses), focal=np.float64(focal), near=near, far=far
    )
    return path
