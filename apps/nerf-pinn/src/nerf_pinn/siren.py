"""``nerf-pinn siren``: SIREN (Sitzmann et al. 2020) fitting an image, dense vs linearized sine layers.

Every layer is ``sin(omega_0 (W x + b))`` with ``omega_0 = 30``; the first layer's weights are drawn from
``U(-1/d, 1/d)`` and the others' from ``U(-sqrt(6/d)/omega_0, sqrt(6/d)/omega_0)`` (Sitzmann et al.,
Sec. 3.2), so the pre-activations of the hidden layers start roughly standard normal. The image (by
default scikit-image's bundled ``camera``, resized to ``size x size``) is fitted at every pixel with the
mean squared error, pixels scaled to ``[-1, 1]``; PSNR is measured on ``[0, 1]``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from app_common.plots import pyplot, save_figure
from app_common.seeding import seed_everything
from nerf_pinn.config import SirenConfig
from nerf_pinn.experiment import Family
from nerf_pinn.layers import DENSE, FeedForwardStack
from spectraformer_core import check_int


def load_image(path: Path | None, size: int) -> torch.Tensor:
    """A grayscale image ``(size, size)`` in ``[0, 1]``: the file at ``path``, or skimage's ``camera``.

    Resized with anti-aliasing by ``skimage.transform.resize``; colour images are converted with
    ``skimage.color.rgb2gray``.
    """
    import skimage.color
    import skimage.data
    import skimage.io
    import skimage.transform

    check_int("size", size, 2)  # the image side
    if path is None:
        image = skimage.data.camera()
    else:
        if not Path(path).is_file():
            raise FileNotFoundError(f"{path}: no such image file")
        image = skimage.io.imread(path)
    image = np.asarray(image)
    if image.ndim == 3:
        image = skimage.color.rgb2gray(image[..., :3])
    elif image.dtype == np.uint8:
        image = image / 255.0
    image = skimage.transform.resize(image.astype(np.float64), (size, size), anti_aliasing=True)
    return torch.tensor(np.clip(image, 0.0, 1.0), dtype=torch.float32)


def pixel_coordinates(size: int) -> torch.Tensor:
    """Pixel centres ``(size * size, 2)`` on ``[-1, 1]^2`` (row-major)."""
    axis = torch.linspace(-1, 1, size)
    return torch.stack(torch.meshgrid(axis, axis, indexing="ij"), -1).reshape(-1, 2)


def psnr(prediction: torch.Tensor, target: torch.Tensor) -> float:
    """Peak signal-to-noise ratio in dB of images in ``[0, 1]`` (``prediction`` clipped to it)."""
    mse = float((prediction.clamp(0, 1) - target).pow(2).mean())
    return 10 * math.log10(1 / max(mse, 1e-12))


class Siren(FeedForwardStack):
    """``depth`` sine layers of ``width`` units and a linear output (Sitzmann et al.'s initialization).

    Args:
        in_features: coordinate dimension.
        out_features: channels.
        depth: sine layers.
        width: units per layer.
        omega_0: the frequency factor of every sine layer.
    """

    def __init__(
        self,
        in_features: int = 2,
        out_features: int = 1,
        depth: int = 4,
        width: int = 64,
        omega_0: float = 30.0,
    ) -> None:
        super().__init__(in_features, out_features, depth, width, "sin", scale=omega_0)
        with torch.no_grad():
            for i, layer in enumerate(self.layers):
                d = layer.linear.in_features
                bound = 1 / d if i == 0 else math.sqrt(6 / d) / omega_0
                layer.linear.weight.uniform_(-bound, bound)
            bound = math.sqrt(6 / width) / omega_0
            self.head.weight.uniform_(-bound, bound)

    def forward(self, coords: torch.Tensor) -> torch.Tensor:
        """``(..., in_features)`` -> ``(..., out_features)``."""
        return self.stack(coords)


class SirenFamily(Family, name="siren", metric="psnr"):
    """The SIREN family of `nerf_pinn.experiment.compare`."""

    metric_label = "PSNR (dB)"

    @classmethod
    def metric_from_loss(cls, train_loss: float) -> float:
        """The PSNR of a step's training loss, a lower bound on the PSNR `evaluate` measures then.

        The loss is the mean squared error on pixels scaled to ``[-1, 1]``, four times that on ``[0, 1]``;
        the evaluation also clips the prediction to ``[0, 1]``, which only brings it nearer the image.
        """
        return 10 * math.log10(4 / max(train_loss, 1e-12))

    def __init__(self, config: SirenConfig) -> None:
        super().__init__(config)
        self.config: SirenConfig = config
        self.image = load_image(config.image, config.size)
        self.coords = pixel_coordinates(config.size).to(self.device)
        self.target = (2 * self.image.reshape(-1, 1) - 1).to(self.device)

    def build(self, kind: str) -> nn.Module:
        """The SIREN; for a linearized kind its sine layers chosen by ``--replace`` replaced."""
        config = self.config
        seed_everything(config.seed)
        model = Siren(2, 1, config.depth, config.width, config.omega_0).to(self.device)
        if kind != DENSE:
            sample = self.coords[torch.randperm(self.coords.shape[0], device=self.device)[:2048]]
            self.linearize_mlp_stack(model.layers, kind, config.depth, sample)
        return model

    def loss(self, model: nn.Module, step: int) -> torch.Tensor:
        """Full batch: the mean squared error over every pixel."""
        return (model(self.coords).float() - self.target).pow(2).mean()

    @torch.no_grad()
    def infer(self, model: nn.Module) -> torch.Tensor:
        """The whole image."""
        return model(self.coords)

    def evaluate(self, model: nn.Module) -> dict[str, Any]:
        """PSNR of the reconstruction, and the reconstruction for the plots."""
        image = ((self.infer(model).float().cpu() + 1) / 2).reshape(self.image.shape)
        return {"psnr": psnr(image, self.image), "outputs": image}

    def plot(self, outputs: dict[str, Any], out: Path) -> list[Path]:
        """Ground truth beside every variant's reconstruction."""
        plt = pyplot()

        kinds = list(outputs)
        fig, axes = plt.subplots(1, len(kinds) + 1, figsize=(2.6 * (len(kinds) + 1), 2.9))
        axes[0].imshow(self.image.numpy(), cmap="gray", vmin=0, vmax=1)
        axes[0].set_title("ground truth")
        for ax, kind in zip(axes[1:], kinds, strict=True):
            ax.imshow(outputs[kind].clamp(0, 1).numpy(), cmap="gray", vmin=0, vmax=1)
            ax.set_title(f"{kind}: {psnr(outputs[kind], self.image):.1f} dB", fontsize=9)
        for ax in axes:
            ax.axis("off")
        return [save_figure(fig, out / "siren.png", dpi=110)]
