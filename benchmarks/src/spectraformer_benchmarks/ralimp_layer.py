"""Speed, size and accuracy of RaLiMP, EUGen, SNNK and LowRank layers against the dense Linear + activation.

Two tables, every number measured in the same run.

``--table speed`` (default). For each width ``d`` (MLP hidden width ``4 d``), a dense ``fc1`` (``d -> 4d``) +
GELU (+ ``fc2``, ``4d -> d``) with PyTorch's default initialization is replaced by each method through
``ralimp.create(kind, fc1, "gelu", budget=32)`` (the paper's budget; RaLiMP: K=2 with 8 polynomial
features, one atom, 3 Gauss-Laguerre nodes with 4 projections each; EUGen and SNNK: 32 projections;
LowRank: rank 32), with the paper's ``Psi(W)`` start:

- forward time of the layer in training mode (``Psi`` recomputed) and eval mode (``Psi`` cached), as a
  ratio to the dense ``fc1`` + GELU;
- forward time of the layer compressed with ``fc2`` (``compress``), ratio to dense ``fc1`` + GELU + ``fc2``;
- trainable parameters of the layer (ratio to ``fc1``) and of the compressed pair (to ``fc1`` + ``fc2``);
- relative output MSE ``E ||y - gelu(fc1 x)||^2 / ||gelu(fc1 x)||^2`` at initialization on standard-normal
  inputs (what a LayerNorm feeds an MLP): the exact expectation over the projections for RaLiMP and EUGen
  (``ralimp.analysis``; a sampled MSE of this log-normal estimator misses it by many orders of magnitude),
  exact for LowRank (deterministic), and for SNNK a sampled MSE over ``--seeds`` draws, marked ``>=``: a
  sample lower bound, not the variance.

``--table init``. The calibrated start at ``--widths`` (hidden ``4 d``) and ``--budgets``: for each method,
the relative MSE at initialization on ``--eval-rows`` held-out standard-normal inputs of

- ``psi``: the paper's ``Psi(W)`` (exact expectation as above; SNNK sampled, ``>=``),
- ``lstsq``: the readout fitted by ridge least squares on ``--calibration-rows`` other inputs
  (``init="lstsq"``), with ``balance=1`` (the paper) and ``balance="auto"`` (RaLiMP and SNNK; EUGen has none),
- ``floor``: the fixed-projection information floor, the least-squares readout fitted on the evaluation
  inputs themselves (no readout of these random features does better on them; ``balance="auto"``),
- ``Eckart-Young``: the rank-``F`` floor of the target matrix, ``F`` the width of the layer's ``Phi``
  (no separable layer ``Psi Phi(x)`` of width ``F`` does better).

``--table variance``. At ``--widths``, budget 32, 1024 standard-normal inputs, ``fit="discretized"`` on
``[-4, 4]`` with one atom: the exact relative MSE of the ``Psi(W)`` start with ``balance=1`` (the paper)
and ``"auto"``, next to the sampled MSE (median of ``--seeds`` draws, a lower bound), the median
``|cos theta|`` and the median lower bound of ``log E|Y|^2`` of the largest node
(``ralimp.analysis.log_second_moment_bound``).

``--table goals``. The fit modes side by side (``fit="discretized"`` on a fixed ``[-4, 4]`` with one
atom, against the default ``fit="variance"`` with its chosen number of atoms), on three layers:
``Linear(16, 24)`` with ``poly_features=512, freq_features=256`` (exact expected relative MSE of ``Psi(W)`` on
standard-normal inputs); ``Linear(256, 256)`` with unit-norm rows at budget 256, ``init="lstsq"`` on 8192
standard-normal rows, relative MSE on 4096 others; a ``64 -> 64`` relu layer fed one direction at
``|x| = 8, 16, 64`` (max ``|y|`` against the target's, or the overflow guard's ``ValueError``).

Run: ``uv run --frozen --package spectraformer-benchmarks python -m spectraformer_benchmarks.ralimp_layer
[--table init|variance|goals]``.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import ralimp
from app_common.device import device_name
from app_common.measure import count_parameters, median_seconds
from ralimp import analysis
from ralimp.base import ridge_readout
from spectraformer_benchmarks.common import command_line
from spectraformer_core import resolve_device
from spectraformer_core.testing import relative_error

KINDS = ("ralimp", "eugen", "snnk", "lowrank")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", choices=tuple(TABLES), default="speed")
    parser.add_argument("--widths", type=int, nargs="+", default=[256, 768, 1280])
    parser.add_argument("--budgets", type=int, nargs="+", default=[32, 128, 512], help="--table init")
    parser.add_argument("--tokens", type=int, default=512, help="rows of the timed input batch")
    parser.add_argument("--calibration-rows", type=int, default=4096, help="--table init")
    parser.add_argument("--eval-rows", type=int, default=4096, help="held-out rows (MSEs)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per measurement (median)")
    parser.add_argument("--seeds", type=int, default=3, help="draws of the sampled SNNK MSE")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="auto")
    return parser.parse_args(argv)


def timed(fn, repeats: int, device: torch.device) -> float:
    """Median wall time of ``fn()`` in seconds, after two warm-up calls."""
    return median_seconds(fn, repeats=repeats, warmup=2, device=device)


count = count_parameters


def relative(actual: torch.Tensor, target: torch.Tensor) -> float:
    """The relative MSE ``||actual - target||^2 / ||target||^2``."""
    return relative_error(actual, target) ** 2


def scientific(log_value: float) -> str:
    """``exp(log_value)`` as ``1.23e+45``, also beyond float64's range."""
    exponent = math.floor(log_value / math.log(10))
    return f"{math.exp(log_value - exponent * math.log(10)):.3g}e{exponent:+d}"


@torch.no_grad()
def psi_start_mse(kind: str, fc1: nn.Linear, x: torch.Tensor, target: torch.Tensor, seeds: int, budget: int):
    """``(text, value)``: relative MSE of the ``Psi(W)`` start, exact where ``ralimp.analysis`` has it."""
    layer = ralimp.create(kind, fc1, "gelu", budget=budget, seed=0)
    if kind == "lowrank":
        return f"{relative(layer(x), target):.3g}", layer
    if kind in ("ralimp", "eugen"):
        t = fc1(x).double()
        if kind == "ralimp":
            mean, log_var = layer.expected_output(t), analysis.ralimp_log_variance(layer, x)
        else:
            mean, log_var = layer.fit(t), analysis.eugen_variance(layer, fc1, x).log()
        return scientific(analysis.expected_relative_mse(mean, log_var, target, log=True)), layer
    sampled = [
        relative(ralimp.create(kind, fc1, "gelu", budget=budget, seed=s)(x), target) for s in range(seeds)
    ]
    if not all(math.isfinite(v) for v in sampled):  # the float32 output itself overflowed
        return "output not finite", layer
    return f">= {statistics.median(sampled):.3g}", layer


def speed_rows(d: int, args: argparse.Namespace, device: torch.device) -> list[list[str]]:
    """One speed-table row per method at width ``d``."""
    torch.manual_seed(0)
    fc1, fc2 = nn.Linear(d, 4 * d).to(device), nn.Linear(4 * d, d).to(device)
    x = torch.randn(args.tokens, d, device=device)
    x_eval = torch.randn(min(args.eval_rows, 1024), d, device=device)
    with torch.no_grad():
        target = F.gelu(fc1(x_eval))

    def dense_times() -> tuple[float, float, float]:
        # re-timed next to every method: the ratios compare calls made seconds apart
        train = timed(lambda: F.gelu(fc1(x)), args.repeats, device)
        with torch.no_grad():
            return (
                train,
                timed(lambda: F.gelu(fc1(x)), args.repeats, device),
                timed(lambda: fc2(F.gelu(fc1(x))), args.repeats, device),
            )

    rows = []
    for kind in KINDS:
        mse, layer = psi_start_mse(kind, fc1, x_eval, target, args.seeds, 32)
        dense_fc1, dense_eval, dense_pair = dense_times()
        layer.train()
        train = timed(lambda layer=layer: layer(x), args.repeats, device)
        layer.eval()
        with torch.no_grad():
            evaluation = timed(lambda layer=layer: layer(x), args.repeats, device)
            if hasattr(layer, "compress"):
                pair = layer.compress(fc2)
                compressed = timed(lambda pair=pair: pair(x), args.repeats, device)
                pair_params = count(pair)
            else:  # LowRank: the pair is down, up, fc2 (no folding possible through the activation)
                compressed = timed(lambda layer=layer: fc2(layer(x)), args.repeats, device)
                pair_params = count(layer) + count(fc2)
        rows.append(
            [
                str(d),
                kind,
                str(layer.num_random_features),
                f"{train / dense_fc1:.2f}",
                f"{evaluation / dense_eval:.2f}",
                f"{compressed / dense_pair:.2f}",
                f"{count(layer) / count(fc1):.3f}",
                f"{pair_params / (count(fc1) + count(fc2)):.3f}",
                mse,
            ]
        )
    return rows


@torch.no_grad()
def init_rows(d: int, args: argparse.Namespace, device: torch.device) -> list[list[str]]:
    """One init-table row per method and budget at width ``d``."""
    torch.manual_seed(0)
    fc1 = nn.Linear(d, 4 * d).to(device=device, dtype=torch.float64)
    gen = torch.Generator().manual_seed(1)
    x_cal = torch.randn(args.calibration_rows, d, generator=gen, dtype=torch.float64).to(device)
    x_eval = torch.randn(args.eval_rows, d, generator=gen, dtype=torch.float64).to(device)
    target = F.gelu(fc1(x_eval))
    energy = torch.linalg.eigvalsh(target.mT @ target).flip(0).clamp_min(0)
    rows = []
    for budget in args.budgets:
        for kind in ("ralimp", "eugen", "snnk"):
            psi, _ = psi_start_mse(kind, fc1, x_eval, target, args.seeds, budget)
            row = [str(d), str(budget), kind]
            for balance in (1.0, "auto") if kind != "eugen" else (None,):
                options = {} if balance is None else {"balance": balance}
                layer = ralimp.create(
                    kind, fc1, "gelu", budget=budget, sample=x_cal, init="lstsq", seed=0, **options
                )
                row.append(f"{relative(layer(x_eval), target):.3g}")
            if kind == "eugen":
                row.append(row[-1])
            phi = layer.feature_map(x_eval)
            floor = relative(phi.double() @ ridge_readout(phi, target, 0.0).mT, target)
            width = layer.feature_dim
            eckart_young = float(energy[width:].sum() / energy.sum())
            rows.append([*row[:3], str(width), psi, *row[3:], f"{floor:.3g}", f"{eckart_young:.3g}"])
    return rows


@torch.no_grad()
def variance_rows(d: int, args: argparse.Namespace, device: torch.device) -> list[list[str]]:
    """Exact against sampled MSE of the ``Psi(W)`` start at width ``d``, budget 32, and the bound.

    With ``OLD_FIT`` (one atom, least squares on ``[-4, 4]``): the variance of an atom fitted without regard
    to it; the default ``fit="variance"`` chooses against exactly this variance.
    """
    torch.manual_seed(0)
    fc1 = nn.Linear(d, 4 * d).to(device)
    x = torch.randn(1024, d, device=device)
    t = fc1(x).double()
    target = F.gelu(t)
    u = torch.cat([x.double(), torch.ones_like(t[:, :1])], -1)
    v = torch.cat([fc1.weight.double(), fc1.bias.double().unsqueeze(-1)], -1)
    cos = (u @ v.mT) / (u.norm(dim=-1, keepdim=True) * v.norm(dim=-1))
    rows = []
    for balance in (1.0, "auto"):

        def build(seed: int, balance=balance):
            return ralimp.create(
                "ralimp", fc1, "gelu", budget=32, balance=balance, sample=x, seed=seed, **OLD_FIT
            )

        layer = build(0)
        exact = analysis.expected_relative_mse(
            layer.expected_output(t), analysis.ralimp_log_variance(layer, x), target, log=True
        )
        try:
            sampled = f"{statistics.median(relative(build(s)(x), target) for s in range(args.seeds)):.3g}"
        except ValueError as error:  # the overflow guard: float32 cannot hold these features
            sampled = guard_cell(error)
        q = min(atom[3] for atom in layer.fit.atoms)
        bound = analysis.log_second_moment_bound(float(layer.nodes[-1]), t, q, cos)
        rows.append(
            [
                str(d),
                str(balance),
                scientific(exact),
                sampled,
                f"{float(cos.abs().median()):.3g}",
                f"{float(bound.median()):.3g}",
            ]
        )
    return rows


OLD_FIT = {"fit": "discretized", "interval": (-4.0, 4.0)}


def guard_cell(error: ValueError) -> str:
    """The overflow guard's exponent from its message, as a table cell."""
    return "ValueError (exponent " + str(error).split("reaches ")[1].split(" ")[0] + ")"


def goal_rows(args: argparse.Namespace) -> list[list[str]]:
    """The three layers of ``--table goals``, each with ``OLD_FIT`` and the default fit."""
    rows = []
    torch.manual_seed(0)
    small = nn.Linear(16, 24)
    x = torch.randn(4096, 16)
    t = (x.double() @ small.weight.double().T + small.bias.double()).detach()
    for label, options in (("discretized [-4, 4], J = 1", OLD_FIT), ("variance", {})):
        layer = ralimp.RaLiMP.from_linear(
            small, "gelu", poly_features=512, freq_features=256, seed=0, **options
        )
        with torch.no_grad():
            value = analysis.expected_relative_mse(
                layer.expected_output(t), analysis.ralimp_log_variance(layer, x.double()), F.gelu(t), log=True
            )
        rows.append(["Linear(16, 24), 512/256, Psi(W) exact", label, str(layer.num_atoms), scientific(value)])
    gen = torch.Generator().manual_seed(1)
    wide = nn.Linear(256, 256)
    with torch.no_grad():
        wide.weight.copy_(F.normalize(torch.randn(256, 256, generator=gen), dim=-1))
        wide.bias.zero_()
    train, test = torch.randn(8192, 256, generator=gen), torch.randn(4096, 256, generator=gen)
    for label, options in (("discretized [-4, 4], J = 1", OLD_FIT), ("variance", {})):
        try:
            layer = ralimp.create(
                "ralimp", wide, "gelu", budget=256, sample=train, init="lstsq", seed=0, **options
            )
            with torch.no_grad():
                cell, atoms = (
                    f"{relative(layer(test), F.gelu(wide(test))):.3g}",
                    str(layer.num_atoms),
                )
        except ValueError as error:
            cell, atoms = guard_cell(error), "1"
        rows.append(["Linear(256, 256) unit rows, budget 256, lstsq held out", label, atoms, cell])
    torch.manual_seed(0)
    relu = nn.Linear(64, 64)
    direction = F.normalize(torch.randn(64), dim=0)
    for label, options in (
        ("discretized [-4, 4], J = 1, tau = 1", {**OLD_FIT, "tau": 1.0}),
        ("variance", {}),
    ):
        layer = ralimp.RaLiMP.from_linear(relu, "relu", seed=0, **options)
        cells = []
        for radius in (8.0, 16.0, 64.0):
            x1 = radius * direction[None]
            try:
                with torch.no_grad():
                    cells.append(
                        f"{float(layer(x1).abs().max()):.3g} / {float(F.relu(relu(x1)).abs().max()):.3g}"
                    )
            except ValueError as error:
                cells.append(guard_cell(error))
        rows.append(
            [
                "64 -> 64 relu, |x| = 8, 16, 64: max |y| / target",
                label,
                str(layer.num_atoms),
                "; ".join(cells),
            ]
        )
    return rows


Rows = Callable[[argparse.Namespace, torch.device], list[list[str]]]


def per_width(rows: Callable[[int, argparse.Namespace, torch.device], list[list[str]]]) -> Rows:
    """The rows of ``rows(d, args, device)`` for each ``d`` of ``--widths``, in order."""
    return lambda args, device: [row for d in args.widths for row in rows(d, args, device)]


#: ``--table``: each table's Markdown header row and its rows.
TABLES: dict[str, tuple[str, Rows]] = {
    "speed": (
        "| d | method | budget | train fwd / dense | eval fwd / dense | compressed / dense pair "
        "| params / fc1 | compressed params / fc1+fc2 | rel. MSE at init (exact; >= sampled) |",
        per_width(speed_rows),
    ),
    "init": (
        "| d | budget | method | F | Psi(W) | lstsq, balance 1 | lstsq, balance auto | info floor (auto) "
        "| Eckart-Young floor |",
        per_width(init_rows),
    ),
    "variance": (
        "| d | balance | exact rel. MSE | sampled (lower bound) | median cos | median bound s_max |",
        per_width(variance_rows),
    ),
    "goals": (
        "| layer | fit | atoms | relative MSE (or outputs) |",
        lambda args, device: goal_rows(args),
    ),
}


def main(argv: list[str] | None = None) -> None:
    """Print the Markdown table with the machine and the command."""
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    header, table_rows = TABLES[args.table]
    rows = table_rows(args, device)
    machine = device_name(device)
    print(
        f"Machine: {machine}; torch {torch.__version__}; threads {torch.get_num_threads()}; "
        f"tokens {args.tokens}; eval rows {args.eval_rows}; calibration rows {args.calibration_rows}"
    )
    print(f"Command: `{command_line()}`\n")
    print(header)
    print("|" + "---|" * header.count(" | ") + "---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
