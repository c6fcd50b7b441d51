r"""``python -m ralimp.paper_checks {repeated-pairs,nodes,theorem1,params}``: the paper's checks, computed.

- ``repeated-pairs`` (App. C.3): a conjugate pair of multiplicity $n$ contributes terms over
  $(1 + u^2)^j$, $j \le n$; they are realized by the same Gauss-Laguerre nodes and features with the node
  weights $\gamma_k \rho_c(s_k)$, $\gamma_k \rho_s(s_k)$, $\rho$ polynomials of degree $n - 1$
  (`repeated_pair_weights`, `repeated_pair_quadrature`).
- ``nodes`` (App. C.2, Fig. 6 right): Gauss-Laguerre against Monte Carlo ($s \sim \mathrm{Exp}(1)$) nodes,
  both with least-squares coefficients, on an activation's rational fit (`node_placement_errors`).
- ``theorem1`` (Theorem 1, App. A.3): the bound $\varepsilon_\mathrm{rat} + \varepsilon_\mathrm{quad} +
  \sqrt{V_\mathrm{poly} + V_\mathrm{rat}}$ on a layer's $L^2$ error against the error measured over draws of
  its projections (`theorem1_terms`).
- ``params``: dense against RaLiMP parameters of the families' networks at their configurations, with
  $\Psi(W)$ deployed and with App. B's compression into the following linear layers
  (`chain_parameters`).

Every table is printed as Markdown.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ralimp.activations import ACTIVATIONS
from ralimp.analysis import ralimp_log_variance
from ralimp.base import Elementwise
from ralimp.layer import RaLiMP
from ralimp.quadrature import gauss_laguerre
from ralimp.rational import DEFAULT_INTERVAL, activation_fit
from ralimp.replace import create
from spectraformer_core import check_int, check_positive_int, markdown_table

# ------------------------------------------------------------------------------------- App. C.3


def _poly_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Product of two coefficient vectors (lowest degree first)."""
    out = torch.zeros(a.numel() + b.numel() - 1, dtype=torch.float64)
    for i, c in enumerate(a):
        out[i : i + b.numel()] += c * b
    return out


def laplace_numerators(multiplicity: int) -> torch.Tensor:
    r"""Numerators over $(1 + u^2)^n$ of $\int_0^\infty s^k e^{-s} \cos(s u)\, ds$ and of the $\sin$.

    $\int_0^\infty s^k e^{-s} e^{i s u}\, ds = k! / (1 - i u)^{k + 1}
    = k! (1 + i u)^{k + 1} / (1 + u^2)^{k + 1}$
    (App. C.3), so over the common denominator $(1 + u^2)^n$ the $\cos$ integral has the numerator
    $k! \operatorname{Re}(1 + i u)^{k + 1} (1 + u^2)^{n - k - 1}$ and the $\sin$ integral the same with
    $\operatorname{Im}$. Row $k$ ($k < n$) holds the $\cos$ numerator of $s^k$, row $n + k$ the $\sin$ one;
    columns are the coefficients of $u^0 .. u^{2n - 1}$.
    """
    n = check_positive_int("multiplicity", multiplicity)
    rows = torch.zeros(2 * n, 2 * n, dtype=torch.float64)
    one_plus_u2 = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    for k in range(n):
        power = torch.ones(1, dtype=torch.complex128)
        for _ in range(k + 1):  # (1 + i u)^{k+1}
            power = torch.cat([power, torch.zeros(1, dtype=torch.complex128)]) + torch.cat(
                [torch.zeros(1, dtype=torch.complex128), 1j * power]
            )
        rest = torch.ones(1, dtype=torch.float64)
        for _ in range(n - k - 1):
            rest = _poly_mul(rest, one_plus_u2)
        for row, part in ((k, power.real), (n + k, power.imag)):
            coef = math.factorial(k) * _poly_mul(part.to(torch.float64), rest)
            rows[row, : coef.numel()] = coef
    return rows


def repeated_pair_weights(numerator: Sequence[float], multiplicity: int) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The node weight polynomials $\rho_c, \rho_s$ of degree $n - 1$ of $N(u) / (1 + u^2)^n$ (App. C.3).

    $\int_0^\infty (\rho_c(s) \cos su + \rho_s(s) \sin su)\, e^{-s}\, ds = N(u) / (1 + u^2)^n$: a linear
    system in the coefficients of $s^0 .. s^{n-1}$ (`laplace_numerators`).

    Args:
        numerator: $N$'s coefficients of $u^0, u^1, \dots$ (degree at most $2n - 1$: a proper fraction).
        multiplicity: $n$.

    Returns:
        ``(rho_c (n,), rho_s (n,))``, float64.
    """
    n = check_positive_int("multiplicity", multiplicity)
    target = torch.as_tensor(numerator, dtype=torch.float64).reshape(-1)
    if target.numel() > 2 * n:
        raise ValueError(
            f"numerator: expected degree <= {2 * n - 1} (a proper fraction over (1 + u^2)^{n}), "
            f"got {target.numel()} coefficients"
        )
    padded = torch.zeros(2 * n, dtype=torch.float64)
    padded[: target.numel()] = target
    solution = torch.linalg.solve(laplace_numerators(n).mT, padded)
    return solution[:n], solution[n:]


def repeated_pair_quadrature(
    rho_c: torch.Tensor, rho_s: torch.Tensor, u: torch.Tensor, num_freqs: int
) -> torch.Tensor:
    r"""$\sum_k \gamma_k (\rho_c(s_k) \cos s_k u + \rho_s(s_k) \sin s_k u)$ at the Gauss-Laguerre nodes.

    The layer's node coefficients with these weights (the features are unchanged); ``u`` any shape,
    float64 out. A shifted term $N(u) / ((t - p)^2 + q^2)^n$ is this at $u = (t - p) / q$, times
    $q^{-2n}$ (with $N$ written in $u$).
    """
    nodes, gammas = gauss_laguerre(num_freqs)
    powers = nodes.unsqueeze(-1) ** torch.arange(rho_c.numel(), dtype=torch.float64)
    w_c, w_s = gammas * (powers @ rho_c.double()), gammas * (powers @ rho_s.double())
    arg = torch.as_tensor(u, dtype=torch.float64).unsqueeze(-1) * nodes
    return (w_c * arg.cos() + w_s * arg.sin()).sum(-1)


#: The terms the ``repeated-pairs`` table realizes: (label, numerator in u, multiplicity).
REPEATED_TERMS: tuple[tuple[str, tuple[float, ...], int], ...] = (
    ("1/(1+u^2)", (1.0,), 1),
    ("u/(1+u^2)", (0.0, 1.0), 1),
    ("1/(1+u^2)^2", (1.0,), 2),
    ("u/(1+u^2)^2", (0.0, 1.0), 2),
    ("(1-u^2)/(1+u^2)^2", (1.0, 0.0, -1.0), 2),
    ("1/(1+u^2)^3", (1.0,), 3),
    ("u^3/(1+u^2)^3", (0.0, 0.0, 0.0, 1.0), 3),
)


def repeated_pairs_table(node_counts: Sequence[int], u_max: float = 4.0, points: int = 2001) -> str:
    r"""Per term of `REPEATED_TERMS`: $\rho_c, \rho_s$ and the largest error on $|u| \le$ ``u_max``."""
    u = torch.linspace(-u_max, u_max, points, dtype=torch.float64)
    rows = []
    for label, numerator, n in REPEATED_TERMS:
        rho_c, rho_s = repeated_pair_weights(numerator, n)
        exact = sum(c * u**i for i, c in enumerate(numerator)) / (1 + u**2) ** n
        errors = [
            float((repeated_pair_quadrature(rho_c, rho_s, u, k) - exact).abs().max()) for k in node_counts
        ]
        rows.append(
            [
                label,
                str(n),
                " ".join(f"{v + 0.0:+.3g}" for v in rho_c.tolist()),
                " ".join(f"{v + 0.0:+.3g}" for v in rho_s.tolist()),
                *(f"{e:.2g}" for e in errors),
            ]
        )
    head = ["term", "n", "rho_c (s^0..)", "rho_s (s^0..)", *(f"max error, {k} nodes" for k in node_counts)]
    return markdown_table(head, rows)


# --------------------------------------------------------------------------- App. C.2, Fig. 6


def node_set_error(
    fn_values: torch.Tensor, t: torch.Tensor, poly_degree: int, atoms: torch.Tensor, nodes: torch.Tensor
) -> tuple[float, float]:
    r"""RMS error and largest $|$coefficient$|$ of the least-squares fit in the layer's basis at ``nodes``.

    Columns $t^0..t^K$, and per atom $(A, B, p, q)$ of ``atoms`` ``(J, 4)`` and node $s$:
    $\cos(s (t - p) / q)$, $\sin(s (t - p) / q)$ (Sec. 2.4); coefficients by least squares (the fair
    comparison of App. C.2: both node sets get their optimal coefficients). Float64.
    """
    t = t.double()
    cols = [t**k for k in range(poly_degree + 1)]
    for _, _, p, q in atoms.double().tolist():
        arg = ((t - p) / q).unsqueeze(-1) * nodes.double()
        cols += [*arg.cos().unbind(-1), *arg.sin().unbind(-1)]
    basis = torch.stack(cols, -1)
    coef = torch.linalg.lstsq(basis, fn_values.double().unsqueeze(-1), driver="gelsd").solution.squeeze(-1)
    rms = float((basis @ coef - fn_values.double()).pow(2).mean().sqrt())
    return rms, float(coef[poly_degree + 1 :].abs().max()) if coef.numel() > poly_degree + 1 else 0.0


def node_placement_errors(
    activation: str,
    node_counts: Sequence[int],
    *,
    poly_degree: int = 2,
    num_atoms: int = 1,
    interval: tuple[float, float] = DEFAULT_INTERVAL,
    draws: int = 100,
    points: int = 2001,
    seed: int = 0,
) -> list[dict[str, Any]]:
    r"""Gauss-Laguerre against Monte Carlo nodes on ``activation``'s rational fit (App. C.2, Fig. 6 right).

    The atoms $(p, q)$ are those of the continuous fit (`ralimp.activation_fit`); for each count $n$ the
    basis of `node_set_error` is fitted by least squares on ``points`` uniform points of ``interval``, once
    at the Gauss-Laguerre nodes and ``draws`` times at $n$ i.i.d. $\mathrm{Exp}(1)$ nodes (the density
    $e^{-s}$ the integral is the expectation under).

    Returns:
        A row per count: ``num_freqs``, ``gl_rms``, ``mc_median``, ``mc_q25``, ``mc_q75`` (RMS errors),
        ``gl_coef`` and ``mc_coef_median`` (largest $|$node coefficient$|$).
    """
    fit = activation_fit(activation, poly_degree=poly_degree, num_atoms=num_atoms, interval=interval)
    t = torch.linspace(*interval, points, dtype=torch.float64)
    target = ACTIVATIONS.get(activation)(t)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for n in node_counts:
        gl, gl_coef = node_set_error(target, t, poly_degree, fit.atom_table, gauss_laguerre(n)[0])
        draws_nodes = [torch.empty(n, dtype=torch.float64).exponential_(generator=gen) for _ in range(draws)]
        mc = torch.tensor(
            [node_set_error(target, t, poly_degree, fit.atom_table, s) for s in draws_nodes],
            dtype=torch.float64,
        )
        q25, q50, q75 = torch.quantile(
            mc[:, 0], torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)
        ).tolist()
        rows.append(
            {
                "num_freqs": n,
                "gl_rms": gl,
                "mc_median": q50,
                "mc_q25": q25,
                "mc_q75": q75,
                "gl_coef": gl_coef,
                "mc_coef_median": float(mc[:, 1].median()),
            }
        )
    return rows


# ------------------------------------------------------------------------------- Theorem 1


@dataclasses.dataclass(frozen=True)
class TheoremTerms:
    r"""Theorem 1's terms for one layer, as RMS over its (input, output) pairs (and projection draws).

    Attributes:
        eps_rat: $\lVert f - R\rVert$, the continuous rational fit's error.
        eps_quad: $\lVert R - \mathbb E\,\hat y\rVert$, the Gauss-Laguerre discretization's error.
        std: $\sqrt{V_\mathrm{poly} + V_\mathrm{rat}}$, the mean exact variance over the projections.
        bound: ``eps_rat + eps_quad + std``.
        exact: $\sqrt{\lVert \mathbb E\,\hat y - f\rVert^2 + V}$, the exact expected error (Props. 1, 2).
        measured: the RMS of $\hat y - f$ over ``draws`` seeds of the projections (an estimate of ``exact``).
        measured_se: its standard error over the draws.
        signal: the RMS of $f$.
        log_bound_exponent: the largest $2\sigma^2$ bound of `RaLiMP.check_exponent` on the inputs.
    """

    eps_rat: float
    eps_quad: float
    std: float
    bound: float
    exact: float
    measured: float
    measured_se: float
    signal: float
    log_bound_exponent: float


@torch.no_grad()
def theorem1_terms(
    linear: nn.Linear,
    activation: str,
    sample: torch.Tensor,
    *,
    budget: int = 32,
    draws: int = 16,
    **options: Any,
) -> TheoremTerms:
    r"""Theorem 1's bound against the measured error of the paper's layer replacing ``activation(linear(x))``.

    The layer is `ralimp.create` ``("ralimp", ..., fit="paper", weight_matrix="base", exponent_guard=False)``
    calibrated on ``sample`` ``(N, d)``: the continuous fit $R$ on the sample's range, discretized node by
    node at the Gauss-Laguerre weights, so $\mathbb E\,\hat y$ is that discretization (``options`` go to
    `ralimp.create`). Everything in float64; the $L^2$ norms are RMS over the sample and the outputs.
    """
    sample = sample.double()
    linear = copy.deepcopy(linear).double()
    target = ACTIVATIONS.get(activation)(linear(sample))
    t = linear(sample)
    kw = {"fit": "paper", "weight_matrix": "base", "exponent_guard": False, **options}
    layers = []
    for seed in range(draws):
        built = create("ralimp", linear, activation, budget=budget, sample=sample, seed=seed, **kw)
        assert isinstance(built, RaLiMP)
        layers.append(built)
    layer = layers[0]
    continuous = layer.fit.continuous
    if continuous is None:
        raise ValueError("options: the layer's fit has no continuous rational fit (use fit='paper')")
    rational = continuous(t)
    mean = layer.expected_output(t)
    variance = ralimp_log_variance(layer, sample).exp()
    eps_rat = float((target - rational).pow(2).mean().sqrt())
    eps_quad = float((rational - mean).pow(2).mean().sqrt())
    std = float(variance.mean().sqrt())
    exact = float(((mean - target).pow(2).mean() + variance.mean()).sqrt())
    per_draw = torch.stack([(m(sample) - target).pow(2).mean() for m in layers])
    measured = float(per_draw.mean().sqrt())
    measured_se = float(per_draw.std() / math.sqrt(draws)) / (2 * measured) if draws > 1 else math.nan
    signal = float(target.pow(2).mean().sqrt())
    u = torch.cat([sample, torch.ones_like(sample[:, :1])], -1)
    _, _, _, freqs = layer._projections(torch.float64)
    exponent = float(layer.exponent_bound(u, freqs)) if freqs.numel() else 0.0
    bound = eps_rat + eps_quad + std
    return TheoremTerms(eps_rat, eps_quad, std, bound, exact, measured, measured_se, signal, exponent)


#: The layers of the ``theorem1`` table: (activation, d, input scale). ``fc1: d -> 4d`` at PyTorch's
#: default initialization, inputs ``scale * N(0, I)``.
THEOREM_LAYERS: tuple[tuple[str, int, float], ...] = (
    ("gelu", 4, 0.05),
    ("tanh", 4, 0.05),
    ("gelu", 4, 0.2),
    ("gelu", 4, 1.0),
    ("tanh", 4, 1.0),
    ("gelu", 16, 1.0),
    ("gelu", 64, 1.0),
)


def theorem1_table(rows: int = 256, draws: int = 16, seed: int = 0) -> str:
    """`theorem1_terms` for every layer of `THEOREM_LAYERS`, a Markdown table."""
    out = []
    for activation, d, scale in THEOREM_LAYERS:
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        linear = nn.Linear(d, 4 * d)
        sample = scale * torch.randn(rows, d, generator=gen, dtype=torch.float64)
        r = theorem1_terms(linear, activation, sample, draws=draws)
        out.append(
            [
                f"{activation}, {d} -> {4 * d}, inputs {scale:g} N(0, I)",
                f"{r.signal:.2g}",
                f"{r.log_bound_exponent:.3g}",
                f"{r.eps_rat:.2g}",
                f"{r.eps_quad:.2g}",
                f"{r.std:.3g}",
                f"{r.bound:.3g}",
                f"{r.exact:.3g}",
                f"{r.measured:.3g} +- {r.measured_se:.2g}",
                "yes" if r.exact <= r.bound and r.measured <= r.bound + 2 * r.measured_se else "NO",
            ]
        )
    head = [
        "layer",
        "RMS f",
        "2 sigma^2 bound",
        "eps_rat",
        "eps_quad",
        "sqrt(V)",
        "bound",
        "exact E error",
        f"measured, {draws} draws (+- s.e.)",
        "within bound (measured: 2 s.e.)",
    ]
    return markdown_table(head, out)


# ------------------------------------------------------------------------- parameter accounting


@dataclasses.dataclass(frozen=True)
class ChainLayer:
    r"""One linear map of a network: its shape and, for a replaced one, the linears that read its output.

    ``readers`` are ``(index, column offset)`` of the linears whose input contains this layer's output
    (at that offset: a skip connection concatenates); App. B folds $\\Psi(W)$ into each of them.
    """

    in_features: int
    out_features: int
    replaced: bool = False
    readers: tuple[tuple[int, int], ...] = ()


def chain_parameters(
    chain: Sequence[ChainLayer],
    activation: str | Elementwise,
    *,
    budget: int,
    num_atoms: int,
    num_freqs: int = 1,
) -> dict[str, int]:
    r"""Parameters of a network of linear maps, dense and with RaLiMP in its replaced layers.

    Every replaced layer is built (`ralimp.create`, ``fit="discretized"`` with ``num_atoms`` atoms; the
    sizes do not depend on the fit) and its readers compressed with `RaLiMP.compress` on the columns they
    read, so the counts are those of the built modules.

    Returns:
        ``dense`` (weights and biases), ``ralimp_train`` (RaLiMP's trainable parameters: $W$, $b$, the
        polynomial and atom coefficients), ``ralimp_deployed`` ($\Psi(W)$, ``out x F``, in place of each
        replaced layer), ``ralimp_compressed`` (App. B: $\hat W = W' \Psi(W)$ in place of each replaced
        layer and the columns of its readers), ``projections`` (entries of the random projection
        matrices, buffers a seed regenerates).
    """
    dense = ralimp_train = deployed = compressed = projections = 0
    built: dict[int, RaLiMP] = {}
    by_shape: dict[tuple[int, int], RaLiMP] = {}  # the sizes depend on the shape alone: one build per shape
    torch.manual_seed(0)
    for i, spec in enumerate(chain):
        linear = nn.Linear(spec.in_features, spec.out_features)
        count = sum(p.numel() for p in linear.parameters())
        dense += count
        if not spec.replaced:
            ralimp_train += count
            deployed += count
            continue
        shape = (spec.in_features, spec.out_features)
        if shape not in by_shape:
            made = create(
                "ralimp",
                linear,
                activation,
                budget=budget,
                fit="discretized",
                num_atoms=num_atoms,
                num_freqs=num_freqs,
            )
            assert isinstance(made, RaLiMP)
            by_shape[shape] = made
        layer = built[i] = by_shape[shape]
        ralimp_train += sum(p.numel() for p in layer.parameters())
        deployed += layer.psi().numel()
        projections += sum(b.numel() for name, b in layer.named_buffers() if "matrices" in name)
    compressed = deployed
    for i, layer in built.items():
        compressed -= layer.psi().numel()
        for reader, offset in chain[i].readers:
            spec = chain[reader]
            folded = layer.compress(nn.Linear(layer.out_features, spec.out_features, bias=False))
            compressed += sum(p.numel() for p in folded.parameters())
            compressed -= spec.out_features * layer.out_features  # the columns of the reader it replaces
            assert offset + layer.out_features <= spec.in_features
    return {
        "dense": dense,
        "ralimp_train": ralimp_train,
        "ralimp_deployed": deployed,
        "ralimp_compressed": compressed,
        "projections": projections,
    }


def stack_chain(
    in_features: int, out_features: int, depth: int, width: int, replaced: Sequence[int]
) -> list[ChainLayer]:
    """`ChainLayer` list of nerf-pinn's ``FeedForwardStack`` (PINN, SIREN): ``depth`` layers, then a head."""
    chain = [
        ChainLayer(in_features if i == 0 else width, width, i in replaced, ((i + 1, 0),))
        for i in range(depth)
    ]
    return [*chain, ChainLayer(width, out_features)]


def nerf_chain(
    depth: int, width: int, skip: int, pos_freqs: int, dir_freqs: int, replaced: Sequence[int]
) -> list[ChainLayer]:
    """`ChainLayer` list of nerf-pinn's ``NeRF``: trunk (skip concatenates the encoding), heads."""
    enc = 3 * (1 + 2 * pos_freqs)
    trunk = []
    for i in range(depth):
        readers = ((i + 1, 0),) if i + 1 < depth else ((depth, 0), (depth + 1, 0))
        trunk.append(
            ChainLayer(enc if i == 0 else width + (enc if i == skip else 0), width, i in replaced, readers)
        )
    if dir_freqs > 0:
        heads = [
            ChainLayer(width, 1),
            ChainLayer(width, width),
            ChainLayer(width + 3 * (1 + 2 * dir_freqs), width // 2),
            ChainLayer(width // 2, 3),
        ]
    else:
        heads = [ChainLayer(width, 1), ChainLayer(width, 3)]
    return [*trunk, *heads]


def transformer_chain(width: int, hidden: int, blocks: int, replaced: int) -> list[ChainLayer]:
    """The MLPs (``width -> hidden -> width``) of ``blocks`` blocks, the last ``replaced`` linearized."""
    chain: list[ChainLayer] = []
    for b in range(blocks):
        up = len(chain)
        chain += [
            ChainLayer(width, hidden, b >= blocks - replaced, ((up + 1, 0),)),
            ChainLayer(hidden, width),
        ]
    return chain


def _alternate(depth: int) -> list[int]:
    return list(range(1, depth, 2))


#: The families' networks at the configurations of the docs' tables and the paper's: (family, setting,
#: activation, chain, budget, atoms of the paper's layout, nodes per atom, what the chain covers).
FAMILIES: tuple[tuple[str, str, str | Elementwise, list[ChainLayer], int, int, str], ...] = (
    (
        "PINN",
        "quick and paper (8 x 20, budget 32)",
        "tanh",
        stack_chain(2, 1, 8, 20, _alternate(8)),
        32,
        1,
        "whole network",
    ),
    (
        "SIREN",
        "quick (4 x 64, budget 32)",
        torch.sin,
        stack_chain(2, 1, 4, 64, _alternate(4)),
        32,
        1,
        "whole network",
    ),
    (
        "SIREN",
        "paper (5 x 256, budget 64)",
        torch.sin,
        stack_chain(2, 1, 5, 256, _alternate(5)),
        64,
        1,
        "whole network",
    ),
    (
        "NeRF",
        "quick (trunk 4 x 64, budget 32)",
        "relu",
        nerf_chain(4, 64, -1, 6, 0, (1, 3)),
        32,
        1,
        "whole network",
    ),
    (
        "NeRF",
        "paper (8 x 256, skip 4, budget 64)",
        "relu",
        nerf_chain(8, 256, 4, 10, 4, (1, 3, 5, 7)),
        64,
        1,
        "whole network",
    ),
    (
        "ViT-B/16",
        "last 4 of 12 MLPs (768 -> 3072), budget 32",
        "gelu",
        transformer_chain(768, 3072, 12, 4),
        32,
        1,
        "MLPs only",
    ),
    (
        "GPT-2 Large",
        "last 18 of 36 MLPs (1280 -> 5120), budget 128",
        "gelu_tanh",
        transformer_chain(1280, 5120, 36, 18),
        128,
        1,
        "MLPs only",
    ),
)


def parameters_table(atoms: Sequence[int] = (0, 1)) -> str:
    """`chain_parameters` of every network of `FAMILIES`, without and with the paper's atom (Markdown)."""
    rows = []
    for family, setting, activation, chain, budget, _, covers in FAMILIES:
        for j in atoms:
            c = chain_parameters(chain, activation, budget=budget, num_atoms=j)
            rows.append(
                [
                    family,
                    setting,
                    covers,
                    str(j),
                    f"{c['dense']:,}",
                    f"{c['ralimp_train']:,}",
                    f"{c['ralimp_deployed']:,} ({c['ralimp_deployed'] / c['dense']:.2f})",
                    f"{c['ralimp_compressed']:,} ({c['ralimp_compressed'] / c['dense']:.2f})",
                    f"{c['projections']:,}",
                ]
            )
    head = [
        "family",
        "setting",
        "counted",
        "atoms per replaced layer",
        "dense",
        "RaLiMP, training",
        "RaLiMP, Psi(W) deployed (/ dense)",
        "RaLiMP, compressed, App. B (/ dense)",
        "projection entries (buffers)",
    ]
    return markdown_table(head, rows)


# ----------------------------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--help`` lists them)."""
    parser = argparse.ArgumentParser(
        prog="python -m ralimp.paper_checks", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="check", required=True)
    pairs = sub.add_parser("repeated-pairs", help="App. C.3: repeated conjugate pairs by weighted nodes")
    pairs.add_argument("--nodes", type=int, nargs="+", default=[3, 8, 16, 32], help="Gauss-Laguerre nodes")
    pairs.add_argument("--u-max", type=float, default=4.0, help="errors on |u| <= this")
    nodes = sub.add_parser("nodes", help="Fig. 6 right: Gauss-Laguerre against Monte Carlo nodes")
    nodes.add_argument("--activations", nargs="+", default=["gelu", "silu", "tanh", "sigmoid", "softsign"])
    nodes.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8], help="nodes per atom")
    nodes.add_argument("--draws", type=int, default=100, help="Monte Carlo node sets per count")
    nodes.add_argument("--poly-degree", type=int, default=2, help="K")
    nodes.add_argument("--num-atoms", type=int, default=1, help="J")
    theorem = sub.add_parser("theorem1", help="Theorem 1's bound against the measured error")
    theorem.add_argument("--rows", type=int, default=256, help="inputs per layer")
    theorem.add_argument("--draws", type=int, default=16, help="projection seeds of the measured error")
    sub.add_parser("params", help="dense against RaLiMP parameters per family")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Print the requested check's table."""
    args = parse_args(argv)
    torch.set_num_threads(check_int("threads", args.threads, 1))
    if args.check == "repeated-pairs":
        print(repeated_pairs_table(args.nodes, args.u_max))
    elif args.check == "nodes":
        rows = []
        for activation in args.activations:
            for r in node_placement_errors(
                activation,
                args.nodes,
                poly_degree=args.poly_degree,
                num_atoms=args.num_atoms,
                draws=args.draws,
            ):
                rows.append(
                    [
                        activation,
                        str(r["num_freqs"]),
                        f"{r['gl_rms']:.2g}",
                        f"{r['mc_median']:.2g} [{r['mc_q25']:.2g}, {r['mc_q75']:.2g}]",
                        f"{r['gl_coef']:.2g}",
                        f"{r['mc_coef_median']:.2g}",
                    ]
                )
        head = [
            "activation",
            "nodes",
            "Gauss-Laguerre RMS error",
            f"Monte Carlo RMS error, median [quartiles] of {args.draws}",
            "GL max |coef|",
            "MC max |coef|, median",
        ]
        print(markdown_table(head, rows))
    elif args.check == "theorem1":
        print(theorem1_table(args.rows, args.draws))
    else:
        print(parameters_table())


if __name__ == "__main__":
    main()
