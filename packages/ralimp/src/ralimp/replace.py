"""Swap the MLP blocks of a model for linearized layers: `replace_mlp` and the layer registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from ralimp.activations import activation_name
from ralimp.base import Elementwise, FeatureLinearization
from ralimp.baselines import SNNK, Dense, EUGen, LowRank
from ralimp.budget import BudgetError, check_count, nearest_valid
from ralimp.layer import RaLiMP
from spectraformer_core import Registry, check_int

#: Rows (tokens) of the captured inputs that `replace_mlp` keeps per block to calibrate it.
MAX_CALIBRATION_ROWS = 4096

#: Layer kinds of `create` and `replace_mlp`: ``ralimp``, ``eugen``, ``snnk``, ``lowrank``,
#: ``dense``.
#: An entry is a class with ``budget_options(budget, activation, *, count, **overrides) -> dict`` (its budget
#: policy) and ``from_linear(linear, activation, *, sample, init, **kw)``.


class LayerKind(Protocol):
    """What `LAYERS` holds: a layer class with ``budget_options`` and ``from_linear`` classmethods."""

    def budget_options(
        self, budget: int | None, activation: object = ..., *, count: str = ..., **overrides: Any
    ) -> dict[str, Any]:
        """The constructor sizes that spend ``budget`` exactly."""
        ...

    def from_linear(
        self,
        linear: nn.Linear,
        activation: str | Elementwise = ...,
        *,
        sample: torch.Tensor | None = ...,
        init: str = ...,
        **kw: Any,
    ) -> nn.Module:
        """The layer standing in for ``activation(linear(x))``."""
        ...


LAYERS: Registry[LayerKind] = Registry("layer kind")
LAYERS.register("ralimp")(RaLiMP)
LAYERS.register("eugen")(EUGen)
LAYERS.register("snnk")(SNNK)
LAYERS.register("lowrank")(LowRank)
LAYERS.register("dense")(Dense)


def register(name: str, *, override: bool = False) -> Callable[[LayerKind], LayerKind]:
    """Class decorator adding a layer kind (``budget_options`` and ``from_linear`` as in `LAYERS`)."""
    return LAYERS.register(name, override=override)


def names(pattern: str | None = None) -> list[str]:
    """Registered layer kinds, optionally filtered by a shell pattern."""
    return LAYERS.names(pattern)


def create(
    kind: str | LayerKind,
    linear: nn.Linear,
    activation: str | Elementwise,
    *,
    budget: int | None,
    count: str = "paper",
    sample: torch.Tensor | None = None,
    init: str = "psi",
    **overrides: Any,
) -> nn.Module:
    """The layer of kind ``kind`` replacing ``activation(linear(x))`` that spends ``budget`` exactly.

    The one place where a feature budget is spent: the kind's ``budget_options`` turns ``budget`` into its
    sizes (table in the RaLiMP guide), then ``from_linear`` initializes the layer from ``linear``. The result
    has ``num_random_features == budget`` (``count="paper"``) or ``feature_dim == budget`` (``count="width"``,
    the width-matched comparison).

    Args:
        kind: ``"ralimp"``, ``"eugen"``, ``"snnk"``, ``"lowrank"``, ``"dense"`` (``budget=None``), another
            registered name, or a class.
        linear: the ``nn.Linear`` to replace (with the activation after it).
        activation: registered activation name or elementwise callable.
        budget: the feature budget (None for ``"dense"``).
        count: ``"paper"`` (the paper's count of random features) or ``"width"`` (the width of ``Phi``).
        sample: calibration inputs ``(..., in_features)`` of ``linear``.
        init: ``"psi"`` (the paper's ``Psi(W)``) or ``"lstsq"`` (readout fitted on ``sample``).
        **overrides: other constructor options (``seed``, ``weight_matrix``, ``num_freqs``, ...). A size the
            budget decides (``num_features``, ``rank``; for RaLiMP one of ``poly_features`` and
            ``freq_features`` may be fixed, the budget sets the other).

    Raises:
        BudgetError: the kind cannot spend ``budget`` exactly; the message gives the nearest valid budgets.
    """
    cls = LAYERS.get(kind)
    check_count(count)

    def policy(value: int | None) -> dict[str, int]:
        return cls.budget_options(value, activation, count=count, **overrides)

    try:
        sizes = policy(budget)
    except BudgetError as error:
        nearest = nearest_valid(policy, budget) if isinstance(budget, int) and budget >= 1 else []
        hint = f"; nearest valid budgets: {nearest}" if nearest else ""
        raise BudgetError(f"{error} (kind {kind!r}, count={count!r}){hint}") from None
    layer = cls.from_linear(linear, activation, sample=sample, init=init, **{**overrides, **sizes})
    spent = layer.num_random_features if count == "paper" else layer.feature_dim
    if spent != budget:
        raise BudgetError(
            f"budget: {kind!r}'s budget_options gave {sizes}, which spends {spent} ({count}), not {budget}"
        )
    return layer


#: ``(up Linear, activation, down Linear)`` attribute names of the MLP layouts `find_mlp_blocks` knows:
#: timm ``Mlp`` and HF ViT 5.x ``mlp`` (fc1/act/fc2), nanoGPT ``MLP`` (c_fc/gelu/c_proj), and the
#: ``intermediate`` module of HF ViT 4.x (dense/intermediate_act_fn; its ``output.dense`` stays).
LAYOUTS: tuple[tuple[str, tuple[str, ...], str | None], ...] = (
    ("fc1", ("act", "act_fn", "activation_fn", "activation"), "fc2"),
    ("c_fc", ("gelu", "act", "activation"), "c_proj"),
    ("dense", ("intermediate_act_fn",), None),
)


@dataclass(frozen=True)
class MLPBlock:
    """An MLP block found in a model: the module, the names of its up projection and activation."""

    name: str
    module: nn.Module
    up: str
    act: str
    activation: str | None


def find_mlp_blocks(model: nn.Module) -> list[MLPBlock]:
    """Every MLP block of ``model`` in module order (see `LAYOUTS`).

    A block is a module holding an ``nn.Linear`` up projection followed by an activation attribute (a module
    or function) under one of the known names. ``activation`` is its registered name, or None if unknown.
    """
    blocks = []
    for name, module in model.named_modules():
        for up, acts, down in LAYOUTS:
            linear = getattr(module, up, None)
            if not isinstance(linear, nn.Linear) or (down is not None and not hasattr(module, down)):
                continue
            act = next((a for a in acts if getattr(module, a, None) is not None), None)
            if act is None:
                continue
            blocks.append(MLPBlock(name, module, up, act, activation_name(getattr(module, act))))
            break
    return blocks


def calibration_inputs(
    model: nn.Module, blocks: list[MLPBlock], inputs: object, max_rows: int, seed: int = 0
) -> dict[str, torch.Tensor]:
    """The inputs of every block's up projection when ``model`` runs on ``inputs`` (forward hooks).

    ``inputs`` is a tensor or a tuple (positional arguments of ``model``) or a dict (keyword arguments).
    The model runs once in eval mode (its mode is restored). Each block keeps at most ``max_rows`` rows
    ``(rows, in_features)``, a seeded random subset.
    """
    captured: dict[str, torch.Tensor] = {}

    def hook_for(name: str) -> Callable[[nn.Module, tuple[torch.Tensor, ...], object], None]:
        def hook(_module: nn.Module, args: tuple[torch.Tensor, ...], _output: object) -> None:
            captured[name] = args[0].detach().reshape(-1, args[0].shape[-1])

        return hook

    handles = [getattr(b.module, b.up).register_forward_hook(hook_for(b.name)) for b in blocks]
    was_training = model.training
    model.eval()  # dropout off: calibrate on the activations inference sees
    try:
        with torch.no_grad():
            if isinstance(inputs, dict):
                model(**inputs)
            elif isinstance(inputs, tuple):
                model(*inputs)
            else:
                model(inputs)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    gen = torch.Generator().manual_seed(seed)
    for name, rows in captured.items():
        if rows.shape[0] > max_rows:
            captured[name] = rows[torch.randperm(rows.shape[0], generator=gen)[:max_rows].to(rows.device)]
    missing = [b.name for b in blocks if b.name not in captured]
    if missing:
        raise ValueError(f"inputs: running the model on them never reached the MLP blocks {missing}")
    return captured


def replace_mlp(
    model: nn.Module,
    kind: str | LayerKind = "ralimp",
    *,
    budget: int | None,
    last_k: int | None = None,
    activation: str | None = None,
    inputs: object = None,
    init: str = "psi",
    count: str = "paper",
    max_calibration_rows: int = MAX_CALIBRATION_ROWS,
    **overrides: Any,
) -> list[str]:
    """Replace the MLP blocks of ``model`` (in place) by ``kind`` layers made by `create`.

    In each block the up projection ``Linear`` becomes ``create(kind, up, activation, budget=budget, ...)``,
    which computes ``activation(up(x))``, and the activation attribute becomes ``nn.Identity()``; everything
    else (dropout, norm, the down projection, HF ViT 4.x's ``output`` with its residual) is left as it was,
    so the block's ``forward`` is unchanged. With ``inputs``, the model first runs once on them and forward
    hooks capture what each replaced up projection receives: that real sample calibrates ``tau``, the
    balance and (``init="lstsq"``) the readout of every layer.

    Args:
        model: any ``nn.Module`` with timm ``Mlp``, HF ViT (4.x ``intermediate``/``output`` or 5.x
            ``mlp``) or nanoGPT ``MLP`` blocks.
        kind: ``"ralimp"``, ``"eugen"``, ``"snnk"``, ``"lowrank"``, ``"dense"`` or a registered name or class.
        budget: the feature budget of every layer (`create`; None for ``"dense"``).
        last_k: replace only the last ``k`` blocks (all when None).
        activation: the activation name to approximate (default: read from each block).
        inputs: a batch for ``model`` (tensor, tuple of positional or dict of keyword arguments), or None.
        init: ``"psi"`` or ``"lstsq"`` (needs ``inputs``).
        count: ``"paper"`` or ``"width"`` (`create`).
        max_calibration_rows: rows (tokens) kept per block from the captured inputs.
        **overrides: options of the layer class (``num_freqs=4``, ``weight_matrix="orf"``, ``seed=0``...);
            block ``i`` of the replaced ones gets ``seed + i``.

    Returns:
        The names of the replaced blocks.
    """
    LAYERS.get(kind)
    if init == "lstsq" and inputs is None:
        raise ValueError("inputs: init='lstsq' fits each readout on captured inputs; got inputs=None")
    blocks = find_mlp_blocks(model)
    if not blocks:
        raise ValueError(f"model: found no MLP block (known layouts: {LAYOUTS}) in {type(model).__name__}")
    if last_k is not None:
        check_int("last_k", last_k, 1, maximum=len(blocks))  # at most the MLP blocks
        blocks = blocks[-last_k:]
    samples = {} if inputs is None else calibration_inputs(model, blocks, inputs, max_calibration_rows)
    for index, block in enumerate(blocks):
        act = activation or block.activation
        if act is None:
            raise ValueError(
                f"activation: could not recognize the activation {getattr(block.module, block.act)!r} of "
                f"block {block.name!r}; pass activation='gelu' (or another registered name)"
            )
        options = dict(overrides)
        if options.get("seed") is not None:
            options["seed"] = options["seed"] + index
        layer = create(
            kind,
            getattr(block.module, block.up),
            act,
            budget=budget,
            count=count,
            sample=samples.get(block.name),
            init=init,
            **options,
        )
        if isinstance(layer, RaLiMP):
            layer.name = f"{block.name}.{block.up}" if block.name else block.up
        setattr(block.module, block.up, layer)
        setattr(block.module, block.act, nn.Identity())
    return [block.name for block in blocks]


def fit_summary(model: nn.Module) -> dict[str, dict[str, object]]:
    """Per linearized layer of ``model`` (module path, ``""`` for ``model`` itself) its ``fit_record()``.

    For a RaLiMP: fit mode, fit range, calibration source, ``tau``, the chosen number of atoms and their
    widths; for every kind the budget and the feature width ``F``. JSON-ready, for an app's results line.
    """
    return {
        name: module.fit_record()
        for name, module in model.named_modules()
        if isinstance(module, FeatureLinearization)
    }
