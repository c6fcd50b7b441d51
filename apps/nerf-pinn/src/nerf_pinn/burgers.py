"""Viscous Burgers: the reference solution by the Cole-Hopf transform, and the PDE residual.

``u_t + u u_x = nu u_xx`` on ``x in [-1, 1]``, ``t in [0, 1]``, ``u(0, x) = -sin(pi x)``, ``u(t, +-1) = 0``,
``nu = 0.01 / pi`` (Raissi et al. 2019). With ``u = -2 nu (log phi)_x`` the equation becomes the heat
equation ``phi_t = nu phi_xx``, whose solution from ``phi(0, y) = exp(-cos(pi y) / (2 pi nu))`` gives
(Basdevant et al. 1986):

    u(t, x) = - int sin(pi (x - eta)) f(x - eta) exp(-eta^2 / (4 nu t)) d eta
              / int f(x - eta) exp(-eta^2 / (4 nu t)) d eta,       f(y) = exp(-cos(pi y) / (2 pi nu)).

With ``eta = sqrt(4 nu t) z`` both integrals carry the weight ``exp(-z^2)``: Gauss-Hermite quadrature.
``f`` reaches ``exp(50)``, so the quotient is evaluated in log space as a softmax over the nodes.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from spectraformer_core import check_int

NU = 0.01 / math.pi
"""The viscosity ``0.01 / pi`` of the classic benchmark."""

X_RANGE = (-1.0, 1.0)
T_RANGE = (0.0, 1.0)
MAX_NODES = 350
"""Above about 390 nodes numpy's Gauss-Hermite weights underflow to zero (not finite)."""


def hermite_nodes(n: int, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """Gauss-Hermite nodes ``z_i`` and log weights ``log w_i`` for the weight ``exp(-z^2)``.

    numpy's ``hermgauss`` (Golub-Welsch with Newton refinement) is used because torch has no such routine.
    """
    check_int("quadrature_nodes", n, 1, maximum=MAX_NODES)
    z, w = np.polynomial.hermite.hermgauss(n)
    return torch.tensor(z, dtype=dtype), torch.tensor(np.log(w), dtype=dtype)


def burgers_solution(
    t: torch.Tensor, x: torch.Tensor, *, nu: float = NU, quadrature_nodes: int = 100
) -> torch.Tensor:
    """The exact solution ``u(t, x)`` (Cole-Hopf, Gauss-Hermite in log space), differentiable in ``t, x``.

    Args:
        t: times ``(...)`` in ``[0, 1]`` (``t = 0`` returns the initial condition).
        x: positions ``(...)`` broadcastable with ``t``.
        nu: the viscosity.
        quadrature_nodes: Gauss-Hermite nodes (100 agree with ``burgers_shock.mat`` to a relative L2
            difference of 3e-12; 50 to 1e-8).

    Returns:
        ``u`` with the broadcast shape of ``t`` and ``x``, in their (floating) dtype.
    """
    t, x = torch.broadcast_tensors(torch.as_tensor(t), torch.as_tensor(x))
    if not t.is_floating_point() or not x.is_floating_point():
        raise ValueError(f"t, x: expected floating-point tensors, got {t.dtype} and {x.dtype}")
    if float(t.detach().min()) < 0:
        raise ValueError(f"t: expected times >= 0, got a minimum of {float(t.min())}")
    z, log_w = hermite_nodes(quadrature_nodes, t.dtype)
    z, log_w = z.to(t.device), log_w.to(t.device)
    y = x.unsqueeze(-1) - torch.sqrt(4 * nu * t).unsqueeze(-1) * z  # x - eta at every node
    log_f = -torch.cos(math.pi * y) / (2 * math.pi * nu)
    weights = torch.softmax(log_w + log_f, dim=-1)
    return -(weights * torch.sin(math.pi * y)).sum(-1)


def burgers_residual(u: torch.Tensor, t: torch.Tensor, x: torch.Tensor, *, nu: float = NU) -> torch.Tensor:
    """``u_t + u u_x - nu u_xx`` by automatic differentiation (``t, x`` must require grad).

    Args:
        u: ``u(t, x)`` computed from ``t`` and ``x`` (same shape).
        t: times with ``requires_grad``.
        x: positions with ``requires_grad``.
        nu: the viscosity.
    """
    ones = torch.ones_like(u)
    u_t, u_x = torch.autograd.grad(u, (t, x), ones, create_graph=True)
    (u_xx,) = torch.autograd.grad(u_x, x, torch.ones_like(u_x), create_graph=True)
    return u_t + u * u_x - nu * u_xx


def reference_grid(
    num_x: int = 256, num_t: int = 100, *, quadrature_nodes: int = 100, dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference on the classic grid: ``x (num_x,)``, ``t (num_t,)``, ``u (num_x, num_t)``.

    The grid of ``burgers_shock.mat``: ``x`` uniform on ``[-1, 1]`` with both ends, ``t`` uniform on
    ``[0, 0.99]`` with step 0.01 (``num_t`` points from 0 with step ``1 / num_t``).
    """
    x = torch.linspace(*X_RANGE, num_x, dtype=dtype)
    t = torch.arange(num_t, dtype=dtype) / num_t
    u = burgers_solution(t.unsqueeze(0), x.unsqueeze(1), quadrature_nodes=quadrature_nodes)
    return x, t, u


def compare_with_mat(path: str, *, quadrature_nodes: int = 100) -> dict[str, float]:
    """Relative L2 and max differences between `reference_grid` and a ``burgers_shock.mat`` file.

    The file (Raissi et al.'s ``burgers_shock.mat``) holds ``x (256, 1)``, ``t (100, 1)``,
    ``usol (256, 100)``; it is read with ``scipy.io.loadmat``.
    """
    from pathlib import Path

    import scipy.io

    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such file (expected burgers_shock.mat with x, t, usol)")
    data = scipy.io.loadmat(path)
    missing = {"x", "t", "usol"} - set(data)
    if missing:
        raise ValueError(f"{path}: missing variables {sorted(missing)} (expected x, t, usol)")
    x = torch.tensor(data["x"], dtype=torch.float64).reshape(-1)
    t = torch.tensor(data["t"], dtype=torch.float64).reshape(-1)
    usol = torch.tensor(np.real(data["usol"]), dtype=torch.float64)
    if usol.shape != (x.numel(), t.numel()):
        raise ValueError(f"{path}: usol has shape {tuple(usol.shape)}, expected ({x.numel()}, {t.numel()})")
    u = burgers_solution(t.unsqueeze(0), x.unsqueeze(1), quadrature_nodes=quadrature_nodes)
    diff = u - usol
    return {
        "relative_l2": float(diff.norm() / usol.norm()),
        "max_abs": float(diff.abs().max()),
        "num_x": x.numel(),
        "num_t": t.numel(),
        "quadrature_nodes": quadrature_nodes,
    }
