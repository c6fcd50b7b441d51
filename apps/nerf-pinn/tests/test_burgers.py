import math
from pathlib import Path

import pytest
import torch

from nerf_pinn.burgers import NU, burgers_residual, burgers_solution, compare_with_mat

MAT = Path(__file__).resolve().parents[4] / "shared" / "data" / "burgers_shock.mat"


def test_reference_meets_the_initial_condition():
    x = torch.linspace(-1, 1, 201, dtype=torch.float64)
    u0 = burgers_solution(torch.zeros_like(x), x)
    torch.testing.assert_close(u0, -torch.sin(math.pi * x), atol=1e-12, rtol=0)
    # and it is continuous in t at t = 0
    u_small = burgers_solution(torch.full_like(x, 1e-6), x)
    assert (u_small - u0).abs().max() < 1e-3


def test_reference_meets_the_boundary_conditions():
    t = torch.linspace(0, 1, 51, dtype=torch.float64)
    for side in (-1.0, 1.0):
        u = burgers_solution(t, torch.full_like(t, side))
        assert u.abs().max() < 1e-10


def test_reference_has_a_small_residual_away_from_the_shock():
    gen = torch.Generator().manual_seed(0)
    t = (0.05 + 0.95 * torch.rand(400, generator=gen, dtype=torch.float64)).requires_grad_(True)
    sign = torch.where(torch.rand(400, generator=gen) < 0.5, -1.0, 1.0).double()
    x = (sign * (0.2 + 0.8 * torch.rand(400, generator=gen, dtype=torch.float64))).requires_grad_(True)
    u = burgers_solution(t, x)
    residual = burgers_residual(u, t, x, nu=NU)
    assert residual.abs().max() < 1e-6
    # the solution steepens into a shock at x = 0: there the residual of a smooth surrogate is not small,
    # but the exact solution still satisfies the equation
    t0 = torch.tensor([0.9], dtype=torch.float64, requires_grad=True)
    x0 = torch.tensor([0.003], dtype=torch.float64, requires_grad=True)
    u0 = burgers_solution(t0, x0)
    (u_x,) = torch.autograd.grad(u0, x0, create_graph=True)
    assert u_x.abs().item() > 50  # steep front
    assert burgers_residual(burgers_solution(t0, x0), t0, x0).abs().item() < 1e-3 * u_x.abs().item()


def test_reference_is_odd_in_x():
    t = torch.full((50,), 0.5, dtype=torch.float64)
    x = torch.linspace(0.01, 1, 50, dtype=torch.float64)
    torch.testing.assert_close(burgers_solution(t, -x), -burgers_solution(t, x), atol=1e-12, rtol=0)


def test_quadrature_nodes_out_of_range_are_refused():
    with pytest.raises(ValueError, match="quadrature_nodes"):
        burgers_solution(
            torch.ones(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64), quadrature_nodes=500
        )


@pytest.mark.skipif(not MAT.is_file(), reason=f"{MAT} is not here")
def test_reference_agrees_with_burgers_shock_mat():
    result = compare_with_mat(str(MAT))
    assert result["num_x"] == 256
    assert result["num_t"] == 100
    assert result["relative_l2"] < 1e-6
