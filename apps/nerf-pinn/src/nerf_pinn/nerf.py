"""``nerf-pinn nerf``: NeRF (Mildenhall et al. 2020) on posed images, dense vs linearized trunk layers.

The field maps the positional encoding of a point (and, with ``dir_freqs > 0``, of the view direction) to a
density ``softplus(sigma)`` (mip-NeRF's choice: relu's zero gradient can leave a
field empty for good early in training) and a colour ``sigmoid(rgb)``; the trunk is a stack of relu
layers with an optional
skip connection that concatenates the encoding again. Rays are sampled at stratified depths and rendered
by `nerf_pinn.render.volume_render`; the loss is the mean squared error of ray colours. Held-out
views are rendered at the bin centres and scored by PSNR.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from app_common.plots import pyplot, save_figure
from app_common.seeding import seed_everything
from nerf_pinn.config import NerfConfig, replaced_layers
from nerf_pinn.experiment import Family
from nerf_pinn.layers import DENSE, FeedForward
from nerf_pinn.render import camera_rays, positional_encoding, stratified_samples, volume_render
from nerf_pinn.scenes import Scene, load_scene, render_synthetic_scene
from nerf_pinn.siren import psnr
from spectraformer_core import check_int


class NeRF(nn.Module):
    """The radiance field: ``(points, directions) -> (sigma, rgb)``.

    Args:
        depth: relu layers of the trunk (NeRF: 8).
        width: units per trunk layer (256).
        skip: trunk layer whose input is ``[h, encoding]`` (NeRF: 4; -1 for none).
        pos_freqs: encoding frequencies of the position (10).
        dir_freqs: encoding frequencies of the direction (4; 0: colour does not depend on the view).
    """

    def __init__(
        self, depth: int = 8, width: int = 256, skip: int = 4, pos_freqs: int = 10, dir_freqs: int = 4
    ) -> None:
        super().__init__()
        check_int("depth", depth, 1)
        check_int("width", width, 1)
        if skip >= depth or skip == 0:
            raise ValueError(f"skip: expected -1 or a trunk layer in [1, {depth - 1}], got {skip}")
        self.pos_freqs, self.dir_freqs, self.skip = pos_freqs, dir_freqs, skip
        enc = 3 * (1 + 2 * pos_freqs)
        self.layers = nn.ModuleList(
            FeedForward(enc if i == 0 else width + (enc if i == skip else 0), width, "relu")
            for i in range(depth)
        )
        self.sigma_head = nn.Linear(width, 1)
        if dir_freqs > 0:
            self.feature = nn.Linear(width, width)
            self.view = FeedForward(width + 3 * (1 + 2 * dir_freqs), width // 2, "relu")
            self.rgb_head = nn.Linear(width // 2, 3)
        else:
            self.rgb_head = nn.Linear(width, 3)

    @torch.no_grad()
    def layer_inputs(self, encoding: torch.Tensor) -> list[torch.Tensor]:
        """The input of every trunk layer when ``encoding`` (of points) enters the trunk."""
        inputs, h = [], encoding
        for i, layer in enumerate(self.layers):
            if i == self.skip:
                h = torch.cat([h, encoding], -1)
            inputs.append(h)
            h = layer(h)
        return inputs

    def forward(self, points: torch.Tensor, directions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``points, directions (..., 3)`` -> ``sigma (...)``, ``rgb (..., 3)``."""
        encoding = positional_encoding(points, self.pos_freqs)
        h = encoding
        for i, layer in enumerate(self.layers):
            if i == self.skip:
                h = torch.cat([h, encoding], -1)
            h = layer(h)
        sigma = nn.functional.softplus(self.sigma_head(h).squeeze(-1))
        if self.dir_freqs > 0:
            unit = directions / directions.norm(dim=-1, keepdim=True)
            h = self.view(torch.cat([self.feature(h), positional_encoding(unit, self.dir_freqs)], -1))
        return sigma, torch.sigmoid(self.rgb_head(h))


def render_rays(
    model: nn.Module,
    origins: torch.Tensor,
    directions: torch.Tensor,
    *,
    near: float,
    far: float,
    samples: int,
    jitter: bool,
    background: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Colours ``(R, 3)`` of rays ``(R, 3)``: stratified samples, the field, volume rendering."""
    depths, widths = stratified_samples(
        origins.shape[0], samples, near, far, jitter=jitter, generator=generator, device=origins.device
    )
    points = origins[:, None] + directions[:, None] * depths[..., None]
    sigma, rgb = model(points, directions[:, None].expand_as(points))
    deltas = widths * directions.norm(dim=-1, keepdim=True)
    colour, _, _ = volume_render(sigma, rgb, deltas, background=background)
    return colour


class NerfFamily(Family, name="nerf", metric="psnr"):
    """The NeRF family of `nerf_pinn.experiment.compare`."""

    metric_label = "held-out PSNR (dB)"

    def __init__(self, config: NerfConfig) -> None:
        super().__init__(config)
        self.config: NerfConfig = config
        if config.data is None:
            path = Path(config.out) / "synthetic_scene.npz"
            if not path.is_file():
                render_synthetic_scene(
                    path, num_views=config.num_views, size=config.image_size, seed=config.seed
                )
            data = path
        else:
            data = config.data
        self.scene: Scene = load_scene(data, held_out=config.eval_views, downscale=config.downscale)
        scene = self.scene
        self.near = scene.near if config.near is None else config.near
        self.far = scene.far if config.far is None else config.far
        self.background = 1.0 if Path(data).is_dir() else 0.0  # Blender scenes are composited on white
        rays = [camera_rays(scene.height, scene.width, scene.focal, scene.poses[i]) for i in scene.train]
        self.origins = torch.cat([o.reshape(-1, 3) for o, _ in rays]).to(self.device)
        self.directions = torch.cat([d.reshape(-1, 3) for _, d in rays]).to(self.device)
        self.colours = scene.images[scene.train].reshape(-1, 3).to(self.device)
        self.test_rays = [
            camera_rays(scene.height, scene.width, scene.focal, scene.poses[i]) for i in scene.test
        ]

    def build(self, kind: str) -> nn.Module:
        """The NeRF; for a linearized kind the trunk layers chosen by ``--replace`` replaced."""
        config = self.config
        seed_everything(config.seed)
        model = NeRF(config.depth, config.width, config.skip, config.pos_freqs, config.dir_freqs).to(
            self.device
        )
        if kind != DENSE:
            pick = torch.randperm(self.origins.shape[0], device=self.device)[:256]
            depths, _ = stratified_samples(pick.numel(), 8, self.near, self.far, device=self.device)
            points = self.origins[pick, None] + self.directions[pick, None] * depths[..., None]
            sample = positional_encoding(points.reshape(-1, 3), config.pos_freqs)
            indices = replaced_layers(config.replace, config.depth)
            if config.skip in indices:
                raise ValueError(f"replace: the skip layer {config.skip} cannot be linearized ({indices})")
            self.linearize_mlp_layers(model.layers, kind, indices, model.layer_inputs(sample))
        return model

    def render(self, model: nn.Module, origins: torch.Tensor, directions: torch.Tensor, **kw) -> torch.Tensor:
        """Ray colours with this family's sampling settings."""
        return render_rays(
            model,
            origins,
            directions,
            near=self.near,
            far=self.far,
            samples=self.config.samples,
            background=self.background,
            **kw,
        )

    def training_state(self) -> dict[str, Any]:
        """The ray generator, seeded ``seed`` and checkpointed: a resumed run draws its rays."""
        self.rays = torch.Generator().manual_seed(self.config.seed)
        return {"rays": self.rays}

    def loss(self, model: nn.Module, step: int) -> torch.Tensor:
        """A random batch of training rays, stratified depths redrawn: the mean squared colour error."""
        batch = torch.randint(0, self.origins.shape[0], (self.config.batch_rays,), generator=self.rays)
        batch = batch.to(self.device)
        colour = self.render(
            model, self.origins[batch], self.directions[batch], jitter=True, generator=self.rays
        )
        return (colour.float() - self.colours[batch]).pow(2).mean()

    @torch.no_grad()
    def render_view(self, model: nn.Module, index: int, chunk: int = 4096) -> torch.Tensor:
        """Held-out view ``index`` (of ``scene.test``) rendered at the bin centres, ``(H, W, 3)``."""
        origins, directions = (r.reshape(-1, 3).to(self.device) for r in self.test_rays[index])
        parts = [
            self.render(model, origins[i : i + chunk], directions[i : i + chunk], jitter=False)
            for i in range(0, origins.shape[0], chunk)
        ]
        return torch.cat(parts).reshape(self.scene.height, self.scene.width, 3)

    @torch.no_grad()
    def infer(self, model: nn.Module) -> torch.Tensor:
        """The first held-out view."""
        return self.render_view(model, 0)

    def evaluate(self, model: nn.Module) -> dict[str, Any]:
        """Mean PSNR over the held-out views, and the renderings for the plots."""
        views = [self.render_view(model, i).float().cpu() for i in range(len(self.scene.test))]
        scores = [psnr(v, self.scene.images[i]) for v, i in zip(views, self.scene.test, strict=True)]
        return {"psnr": sum(scores) / len(scores), "psnr_per_view": scores, "outputs": views}

    def plot(self, outputs: dict[str, Any], out: Path) -> list[Path]:
        """Held-out views: the ground truth (first row), then one row per variant."""
        plt = pyplot()

        kinds = list(outputs)
        cols = len(self.scene.test)
        fig, axes = plt.subplots(
            len(kinds) + 1, cols, figsize=(1.9 * cols + 0.6, 1.9 * (len(kinds) + 1)), squeeze=False
        )
        for c, i in enumerate(self.scene.test):
            axes[0, c].imshow(self.scene.images[i].clamp(0, 1).numpy())
            axes[0, c].set_title(f"view {i}", fontsize=8)
            for r, kind in enumerate(kinds, start=1):
                view = outputs[kind][c]
                axes[r, c].imshow(view.clamp(0, 1).numpy())
                axes[r, c].set_title(f"{psnr(view, self.scene.images[i]):.1f} dB", fontsize=8)
        axes[0, 0].set_ylabel("ground truth")
        for r, kind in enumerate(kinds, start=1):
            axes[r, 0].set_ylabel(kind)
        for ax in axes.flat:
            ax.set_xticks([])
            ax.set_yticks([])
        return [save_figure(fig, out / "nerf.png", dpi=110)]
