import math

import torch

from nerf_pinn.render import camera_rays, positional_encoding, stratified_samples, volume_render
from nerf_pinn.scenes import look_at_pose


def test_constant_density_slab_gives_the_analytic_transmittance():
    # a slab of density sigma between depths a and b on rays sampled every 0.01 over [0, 2]
    sigma_value, a, b, n = 3.0, 0.5, 1.3, 200
    edges = torch.linspace(0, 2, n + 1, dtype=torch.float64)
    centres = (edges[:-1] + edges[1:]) / 2
    deltas = edges[1:] - edges[:-1]
    sigma = torch.where((centres > a) & (centres < b), sigma_value, 0.0)
    colour = torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64).expand(n, 3)
    rgb, weights, transmittance = volume_render(sigma, colour, deltas, background=1.0)
    expected = torch.exp(-sigma_value * (edges.clamp(a, b) - a))  # T at every bin edge
    torch.testing.assert_close(transmittance, expected, atol=1e-12, rtol=1e-12)
    through = math.exp(-sigma_value * (b - a))
    torch.testing.assert_close(weights.sum(), torch.tensor(1 - through, dtype=torch.float64))
    torch.testing.assert_close(rgb, colour[0] * (1 - through) + through, atol=1e-12, rtol=0)


def test_stratified_samples_fall_one_in_each_bin():
    depths, widths = stratified_samples(64, 8, 2.0, 6.0, generator=torch.Generator().manual_seed(0))
    bins = torch.floor((depths - 2.0) / 0.5)
    assert torch.equal(bins, torch.arange(8.0).expand(64, 8))
    torch.testing.assert_close(widths, torch.full((64, 8), 0.5))


def test_camera_rays_point_at_the_origin_from_a_look_at_pose():
    pose = look_at_pose(torch.tensor([3.0, 1.0, 2.0], dtype=torch.float64))
    origins, directions = camera_rays(9, 9, 10.0, pose)
    centre = directions[4, 4] / directions[4, 4].norm()
    torch.testing.assert_close(centre, -origins[4, 4] / origins[4, 4].norm())
    assert directions[0, 4] @ pose[:3, 1] > 0  # the top row looks up


def test_positional_encoding_has_the_documented_width_and_terms():
    x = torch.tensor([[0.25, -0.5, 1.0]])
    enc = positional_encoding(x, 3)
    assert enc.shape == (1, 3 * (1 + 2 * 3))
    torch.testing.assert_close(enc[0, :3], x[0])
    torch.testing.assert_close(enc[0, 3 + 1], torch.sin(math.pi * 2.0 * x[0, 0]))
