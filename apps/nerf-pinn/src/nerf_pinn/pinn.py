"""``nerf-pinn pinn``: a physics-informed network for viscous Burgers (Raissi et al. 2019).

The network maps ``(t, x)``, rescaled to ``[-1, 1]^2``, through ``depth`` tanh layers of ``width`` units to
``u``. The loss is the mean squared misfit at ``num_boundary`` initial/boundary points (``u(0, x) = -sin(pi
x)``, ``u(t, +-1) = 0``) plus the mean squared residual ``u_t + u u_x - nu u_xx`` at ``num_collocation``
points (Sobol, as Raissi's Latin hypercube: space-filling). Adam first, then scipy's L-BFGS-B as Raissi et al.
ran it (`ScipyLBFGSB`), which ends training once it converges. The error is the
relative L2 error against `nerf_pinn.burgers.burgers_solution` on the classic 256 x 100 grid.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from app_common.device import autocast
from app_common.plots import pyplot, save_figure
from app_common.seeding import seed_everything
from nerf_pinn.burgers import NU, T_RANGE, X_RANGE, burgers_residual, reference_grid
from nerf_pinn.config import PinnConfig
from nerf_pinn.experiment import Family
from nerf_pinn.layers import DENSE, FeedForwardStack


class PINN(FeedForwardStack):
    """``u(t, x)``: ``depth`` tanh layers of ``width`` units and a linear output, Xavier-normal initialized.

    Args:
        depth: hidden layers (Raissi et al.: 8).
        width: units per hidden layer (20).
    """

    def __init__(self, depth: int = 8, width: int = 20) -> None:
        super().__init__(2, 1, depth, width, "tanh")
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_normal_(module.weight)
                nn.init.zeros_(module.bias)
        self.register_buffer("low", torch.tensor([T_RANGE[0], X_RANGE[0]]))
        self.register_buffer("high", torch.tensor([T_RANGE[1], X_RANGE[1]]))

    def normalize(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``(t, x)`` -> the network input ``(..., 2)`` in ``[-1, 1]^2``."""
        tx = torch.stack([t, x], -1)
        return 2 * (tx - self.low) / (self.high - self.low) - 1

    def forward(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``u(t, x)`` with the shape of ``t`` (and ``x``)."""
        return self.stack(self.normalize(t, x)).squeeze(-1)


def training_points(
    num_boundary: int, num_collocation: int, *, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(t_b, x_b, u_b)`` initial/boundary data and ``(t_f, x_f)`` collocation points (float32).

    Half the initial/boundary candidates lie on ``t = 0`` and a quarter on each of ``x = -1``, ``x = 1``;
    ``num_boundary`` of them are drawn at random (as Raissi et al. draw 100 of 456). The collocation points
    are a scrambled Sobol sequence on ``[0, 1] x [-1, 1]``.
    """
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.linspace(*X_RANGE, 256)
    tb = torch.linspace(*T_RANGE, 100)
    t_all = torch.cat([torch.zeros(256), tb, tb])
    x_all = torch.cat([x0, torch.full((100,), X_RANGE[0]), torch.full((100,), X_RANGE[1])])
    u_all = torch.cat([-torch.sin(math.pi * x0), torch.zeros(200)])
    pick = torch.randperm(t_all.numel(), generator=gen)[:num_boundary]
    sobol = torch.quasirandom.SobolEngine(2, scramble=True, seed=seed).draw(num_collocation)
    t_f = T_RANGE[0] + (T_RANGE[1] - T_RANGE[0]) * sobol[:, 0]
    x_f = X_RANGE[0] + (X_RANGE[1] - X_RANGE[0]) * sobol[:, 1]
    return t_all[pick], x_all[pick], u_all[pick], t_f, x_f


class ScipyLBFGSB(torch.optim.LBFGS):
    """scipy's L-BFGS-B (Raissi et al.'s optimizer) as a torch optimizer, ``max_iter`` iterations a step.

    Each step hands the flattened parameters to ``scipy.optimize.minimize(method="L-BFGS-B")`` with
    ``maxiter = max_iter``, ``maxfun = max_eval``, ``maxcor = history_size``, ``maxls = max_line_search``,
    ``gtol = tolerance_grad`` (largest gradient entry) and ``ftol = tolerance_change`` (relative change of
    the loss), in float64 whatever the parameters' dtype, as TensorFlow's ``ScipyOptimizerInterface`` does
    for Raissi et al. Its line search and curvature test are scipy's: ``torch.optim.LBFGS``'s absolute ones
    (a curvature pair is dropped when ``y.s <= 1e-10``, the line search ends on a bracket below 1e-9) stall
    this PINN near a loss of 5e-6, where scipy goes on. A step starts a fresh L-BFGS memory. It subclasses
    ``torch.optim.LBFGS`` so that the harness passes it a closure.

    ``stop_reason`` is None while the steps run their ``max_iter`` iterations (or ``max_eval`` evaluations),
    and names scipy's message once a step converges (``gtol``, ``ftol``) or its line search fails, as
    Raissi's run ends there. A step taken after a stop evaluates the loss and leaves the parameters alone.
    """

    def __init__(self, params: Any, *, max_line_search: int = 50, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self.max_line_search = max_line_search
        self.stop_reason: str | None = None

    def counters(self) -> tuple[int, int]:
        """``(iterations, function evaluations)`` of all steps so far."""
        state = self.state[self._params[0]]
        return int(state.get("n_iter", 0)), int(state.get("func_evals", 0))

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state (the counters), ``stop_reason`` included (a resumed run keeps it)."""
        return {**super().state_dict(), "stop_reason": self.stop_reason}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load `state_dict` (``stop_reason`` included)."""
        state = dict(state_dict)
        self.stop_reason = state.pop("stop_reason", None)
        super().load_state_dict(state)

    @torch.no_grad()
    def step(self, closure: Any) -> Any:  # type: ignore[override]  # L-BFGS-B requires the closure
        """Up to ``max_iter`` L-BFGS-B iterations (none once ``stop_reason`` is set); the last loss."""
        import numpy as np
        import scipy.optimize

        if self.stop_reason is not None:
            with torch.enable_grad():
                return closure()
        group, params = self.param_groups[0], self._params

        def loss_and_gradient(flat: np.ndarray) -> tuple[float, np.ndarray]:
            vector = torch.from_numpy(flat).to(params[0].device, params[0].dtype)
            torch.nn.utils.vector_to_parameters(vector, params)
            with torch.enable_grad():
                loss = closure()
            grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
            return float(loss), torch.cat([g.reshape(-1) for g in grads]).double().cpu().numpy()

        start = torch.nn.utils.parameters_to_vector(params).double().cpu().numpy()
        result = scipy.optimize.minimize(
            loss_and_gradient,
            start,
            jac=True,
            method="L-BFGS-B",
            options={
                "maxiter": group["max_iter"],
                "maxfun": group["max_eval"],
                "maxcor": group["history_size"],
                "maxls": self.max_line_search,
                "gtol": group["tolerance_grad"],
                "ftol": group["tolerance_change"],
            },
        )
        torch.nn.utils.vector_to_parameters(torch.from_numpy(result.x).to(params[0]), params)
        state = self.state[params[0]]
        state["n_iter"] = self.counters()[0] + int(result.nit)
        state["func_evals"] = self.counters()[1] + int(result.nfev)
        if result.status != 1:  # 1: maxiter or maxfun reached, the next step goes on
            self.stop_reason = f"L-BFGS-B: {result.message} at iteration {state['n_iter']}"
        return torch.tensor(result.fun, dtype=params[0].dtype)


class PinnFamily(Family, name="pinn", metric="relative_l2"):
    """The PINN family of `nerf_pinn.experiment.compare`."""

    metric_label = "relative L2 error (lower is better)"
    metric_lower_is_better = True

    def __init__(self, config: PinnConfig) -> None:
        super().__init__(config)
        self.config: PinnConfig = config
        self.dtype: torch.dtype = getattr(torch, config.precision)
        points = training_points(config.num_boundary, config.num_collocation, seed=config.seed)
        self.t_b, self.x_b, self.u_b, self.t_f, self.x_f = (p.to(self.device, self.dtype) for p in points)
        x, t, u = reference_grid(quadrature_nodes=config.quadrature_nodes)
        self.grid_x, self.grid_t, self.reference = x, t, u
        tt, xx = torch.meshgrid(t.to(self.dtype), x.to(self.dtype), indexing="xy")  # (256, 100) like u
        self.eval_t, self.eval_x = tt.to(self.device), xx.to(self.device)

    def calibration_sample(self, model: PINN) -> torch.Tensor:
        """The inputs the linearized layers are calibrated on: 1,024 collocation points, normalized."""
        return model.normalize(self.t_f[:1024], self.x_f[:1024])

    def build(self, kind: str) -> nn.Module:
        """The PINN; for a linearized kind its hidden layers (or all layers) replaced."""
        config = self.config
        seed_everything(config.seed)
        model = PINN(config.depth, config.width).to(self.device, self.dtype)
        if kind != DENSE:
            self.linearize_mlp_stack(model.layers, kind, config.depth, self.calibration_sample(model))
        return model

    def loss(self, model: nn.Module, step: int = 0) -> torch.Tensor:
        """Initial/boundary misfit plus PDE residual, both mean squared (derivatives in ``precision``)."""
        t_f = self.t_f.clone().requires_grad_(True)
        x_f = self.x_f.clone().requires_grad_(True)
        with autocast(self.device, self.config.dtype):
            u_f, u_b = model(t_f, x_f), model(self.t_b, self.x_b)
        residual = burgers_residual(u_f.to(self.dtype), t_f, x_f, nu=NU)
        misfit = u_b.to(self.dtype) - self.u_b
        return misfit.pow(2).mean() + residual.pow(2).mean()

    def optimizers(self, model: nn.Module) -> dict[str, torch.optim.Optimizer]:
        """Adam, then `ScipyLBFGSB` (``lbfgs_iterations`` a step; Raissi's history 50, line search 50)."""
        config = self.config
        self.lbfgs = ScipyLBFGSB(
            model.parameters(),
            max_iter=config.lbfgs_iterations,
            history_size=50,
            max_line_search=50,
            tolerance_grad=config.lbfgs_tolerance_grad,
            tolerance_change=config.lbfgs_tolerance_change,
        )
        return {"adam": torch.optim.Adam(model.parameters(), lr=config.lr), "lbfgs": self.lbfgs}

    def stop_reason(self) -> str | None:
        """Why L-BFGS stopped early (`ScipyLBFGSB.stop_reason`); None while it runs."""
        return self.lbfgs.stop_reason

    def summary(self) -> dict[str, Any]:
        """The L-BFGS iterations and function evaluations the run took, and why L-BFGS stopped."""
        iterations, evaluations = self.lbfgs.counters()
        return {
            "lbfgs_iterations": iterations,
            "lbfgs_evaluations": evaluations,
            "lbfgs_stop": self.lbfgs.stop_reason,
        }

    def phases(self) -> list[tuple[str, int]]:
        """Adam for ``steps``, then ``lbfgs_steps`` L-BFGS steps."""
        return [("adam", self.config.steps), ("lbfgs", self.config.lbfgs_steps)]

    @torch.no_grad()
    def infer(self, model: nn.Module) -> torch.Tensor:
        """``u`` on the 256 x 100 evaluation grid."""
        return model(self.eval_t, self.eval_x)

    def evaluate(self, model: nn.Module) -> dict[str, Any]:
        """Relative L2 error on the grid, and the prediction for the plots."""
        u = self.infer(model).double().cpu()
        error = float((u - self.reference).norm() / self.reference.norm())
        return {"relative_l2": error, "max_abs_error": float((u - self.reference).abs().max()), "outputs": u}

    def plot(self, outputs: dict[str, Any], out: Path) -> list[Path]:
        """Reference, then every variant's prediction and its absolute error, as heatmaps over ``(t, x)``."""
        plt = pyplot()

        kinds = list(outputs)
        extent = [
            float(self.grid_t[0]),
            float(self.grid_t[-1]),
            float(self.grid_x[0]),
            float(self.grid_x[-1]),
        ]
        fig, axes = plt.subplots(
            2, len(kinds) + 1, figsize=(2.9 * (len(kinds) + 1), 5.2), squeeze=False, layout="constrained"
        )
        style = {"extent": extent, "origin": "lower", "aspect": "auto"}
        im = axes[0, 0].imshow(self.reference.numpy(), cmap="RdBu_r", vmin=-1, vmax=1, **style)
        axes[0, 0].set_title("reference (Cole-Hopf)", fontsize=9)
        axes[1, 0].axis("off")
        errors = {k: (outputs[k] - self.reference).abs() for k in kinds}
        finite = [float(e.max()) for e in errors.values() if torch.isfinite(e).all()]
        vmax = max(finite) if finite else 1.0
        for col, kind in enumerate(kinds, start=1):
            axes[0, col].imshow(outputs[kind].numpy(), cmap="RdBu_r", vmin=-1, vmax=1, **style)
            axes[0, col].set_title(f"{kind}: u(t, x)", fontsize=9)
            err = axes[1, col].imshow(errors[kind].numpy(), cmap="magma", vmin=0, vmax=vmax, **style)
            rel = float((outputs[kind] - self.reference).norm() / self.reference.norm())
            axes[1, col].set_title(f"|error|, rel. L2 {rel:.2e}", fontsize=9)
        fig.colorbar(im, ax=axes[0, :].tolist(), shrink=0.8, label="u")
        fig.colorbar(err, ax=axes[1, 1:].tolist(), shrink=0.8, label="|u - reference|")
        for ax in axes.flat:
            ax.set_xlabel("t")
            ax.set_ylabel("x")
        return [save_figure(fig, out / "pinn.png", dpi=110)]  # laid out by its constrained layout
