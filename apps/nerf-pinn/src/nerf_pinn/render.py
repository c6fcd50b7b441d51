"""NeRF's rays, positional encoding, stratified sampling and volume rendering (Mildenhall et al. 2020).

Shapes: rays ``(R, 3)``, samples ``(R, S)``, densities ``(R, S)``, colours ``(R, S, 3)``.
"""

from __future__ import annotations

import math

import torch


def camera_rays(
    height: int, width: int, focal: float, pose: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Origins and (unnormalized, ``z_cam = -1``) directions ``(H, W, 3)`` of a pinhole camera's pixel rays.

    ``pose`` is camera-to-world ``(4, 4)`` (or ``(3, 4)``) in the OpenGL convention of NeRF's data: the
    camera looks along its ``-z`` axis with ``y`` up, pixel ``(i, j)`` at column ``i``, row ``j``.
    """
    j, i = torch.meshgrid(
        torch.arange(height, dtype=pose.dtype, device=pose.device),
        torch.arange(width, dtype=pose.dtype, device=pose.device),
        indexing="ij",
    )
    dirs = torch.stack(
        [(i + 0.5 - width / 2) / focal, -(j + 0.5 - height / 2) / focal, -torch.ones_like(i)], -1
    )
    directions = dirs @ pose[:3, :3].mT
    return pose[:3, 3].expand_as(directions), directions


def positional_encoding(x: torch.Tensor, num_freqs: int) -> torch.Tensor:
    """``[x, sin(2^k pi x), cos(2^k pi x)]_{k < L}``: ``(..., d)`` -> ``(..., d (1 + 2 L))`` (NeRF Eq. 4).

    ``L = num_freqs``; the sines come grouped by coordinate (all frequencies of ``x_0``, then ``x_1``...).
    """
    if num_freqs == 0:
        return x
    freqs = math.pi * 2.0 ** torch.arange(num_freqs, dtype=x.dtype, device=x.device)
    angles = (x.unsqueeze(-1) * freqs).flatten(-2)
    return torch.cat([x, torch.sin(angles), torch.cos(angles)], -1)


def stratified_samples(
    num_rays: int,
    num_samples: int,
    near: float,
    far: float,
    *,
    jitter: bool = True,
    generator: torch.Generator | None = None,
    device: torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stratified depths ``(R, S)`` and each sample's interval length ``(R, S)`` (the bin width).

    One uniform draw in each of ``S`` equal bins of ``[near, far]`` (their centres when ``jitter`` is False).
    """
    edges = torch.linspace(near, far, num_samples + 1, device=device)
    lower = edges[:-1].expand(num_rays, num_samples)
    if jitter:
        u = torch.rand(num_rays, num_samples, generator=generator, device="cpu").to(lower.device)
    else:
        u = torch.full_like(lower, 0.5)
    depths = lower + (edges[1:] - edges[:-1]) * u
    return depths, (edges[1:] - edges[:-1]).expand(num_rays, num_samples)


def volume_render(
    sigma: torch.Tensor, rgb: torch.Tensor, deltas: torch.Tensor, *, background: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quadrature of the volume rendering integral (Max 1995; NeRF Eq. 3).

    ``alpha_i = 1 - exp(-sigma_i delta_i)``, ``T_i = exp(-sum_{j<i} sigma_j delta_j)``, ``w_i = T_i alpha_i``,
    ``C = sum_i w_i c_i + (1 - sum_i w_i) background``. Exact for densities and colours constant over each
    sample's interval.

    Args:
        sigma: densities ``(..., S)`` (>= 0).
        rgb: colours ``(..., S, 3)``.
        deltas: interval lengths ``(..., S)``, in the units of the ray direction's length.
        background: the colour behind the volume.

    Returns:
        ``(colour (..., 3), weights w (..., S), transmittance T (..., S + 1))``, ``T[..., -1]`` being the
        transmittance through the whole ray.
    """
    optical = sigma * deltas
    cumulative = torch.cumsum(optical, -1)
    transmittance = torch.exp(-torch.cat([torch.zeros_like(cumulative[..., :1]), cumulative], -1))
    weights = transmittance[..., :-1] * (1 - torch.exp(-optical))
    colour = (weights.unsqueeze(-1) * rgb).sum(-2) + (1 - weights.sum(-1, keepdim=True)) * background
    return colour, weights, transmittance
