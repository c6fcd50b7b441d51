"""Linearizing a pretrained softmax model: attention transfer (stage 1), then ordinary fine-tuning (stage 2).

The two stages of LoLCATs (Zhang et al. 2024), for any random-feature pair with learnable feature maps:

1. [`attention_transfer`][rf_attention.transfer.attention_transfer] trains only the feature maps, so that each
   attention layer's random-feature output matches softmax attention on the same ``q, k, v`` (per-layer
   MSE). Inside [`teacher_forced`][rf_attention.transfer.teacher_forced] every layer passes the *softmax*
   output on, so each layer learns on the teacher's activations and one forward pass gives every layer's
   loss.
2. Fine-tuning with the next-token loss, full or LoRA (``peft``, extra ``rf-attention[peft]``):
   [`lora_config`][rf_attention.transfer.lora_config] targets the attention layers' projections, and
   [`freeze_statistics`][rf_attention.transfer.freeze_statistics] keeps OPRF/SADERF running statistics
   where stage 1 left them (an adapter saves neither them nor the feature maps).

Two kinds of models are supported: models built from ``rf_attention`` modules
([`RandomFeatureAttention`][rf_attention.RandomFeatureAttention], e.g. gpt-uptrain's), and Hugging Face
models whose ``attn_implementation`` is an ``"rf-*"`` name of ``rf_attention.hf`` (extra
``rf-attention[hf]``).
Create the maps learnable: ``rf_attention.create(pair, ..., learnable=True)``, or for HF
``rf_attention.hf.register([pair], learnable=True, num_heads=H)`` before loading.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

import rf_features
from rf_attention.functional import input_scale, softmax_attention
from rf_attention.modules import TEACHER_HOOK, RandomFeatureAttention
from rf_attention.ops.common import finite_or_zero
from spectraformer_core import check_int

if TYPE_CHECKING:
    from peft import LoraConfig

#: `attention_transfer`'s default peak learning rate and attention-weight divergence weight (measured on the
#: peaked teacher of the guide "Linearizing a pretrained model").
DEFAULT_LR = 4e-2
DEFAULT_ATTENTION_WEIGHT = 0.0

#: A batch: ``input_ids (B, N)``, or keyword arguments of the model (``attention_mask``: 1 at tokens).
Batch = torch.Tensor | Mapping[str, Any]


@dataclass(frozen=True)
class TransferReport:
    """What [`attention_transfer`][rf_attention.transfer.attention_transfer] did.

    Attributes:
        layers: the attention layers' module names, in the model's order.
        mse_before: per layer, the MSE between its random-feature and softmax outputs on the first batch,
            before training.
        mse_after: the same after training (same batch, eval mode).
        steps: optimizer steps taken (fewer than asked when ``batches`` ran out).
        losses: the objective of each training step (the summed per-layer MSE, plus the weighted
            attention-weight divergences).
        skipped_steps: steps whose gradient was not finite (a feature or normalizer out of float32's
            range on that batch), so the maps were left as they were.
    """

    layers: tuple[str, ...]
    mse_before: tuple[float, ...]
    mse_after: tuple[float, ...]
    steps: int
    losses: tuple[float, ...]
    skipped_steps: int = 0


def masked_mse(
    student: torch.Tensor, teacher: torch.Tensor, keep: torch.Tensor | None, token_dim: int
) -> torch.Tensor:
    """Mean squared difference over the tokens where ``keep (B, N)`` is True (all when None).

    ``student`` and ``teacher`` have the batch at dim 0 and the ``N`` tokens at ``token_dim``; the mean is
    over every element of the kept tokens.
    """
    error = (student.float() - teacher.float()).pow(2)
    if keep is None:
        return error.mean()
    shape = [1] * error.dim()
    shape[0], shape[token_dim] = keep.shape
    kept = keep.to(error.device).view(shape)
    per_token = error[0].numel() // error.shape[token_dim]  # elements of one token (of one sequence)
    # where, not a product: a padded row's output may be anything, NaN included
    return torch.where(kept, error, 0.0).sum() / (kept.sum() * per_token).clamp_min(1)


class LayerLosses:
    """Each attention layer's losses against softmax in the last forward pass under `teacher_forced`.

    Attributes:
        layers: the attention modules, in the model's order.
        values: per layer, the scalar output MSE (with its graph in grad mode), or None if the layer did not
            run its random-feature attention.
        divergences: per layer, the attention-weight divergence
            ([`attention_weight_divergence`][rf_attention.transfer.attention_weight_divergence]) on
            ``attention_rows`` sampled query positions, or None (not asked, or the layer did not run).
        keep: bool ``(B, N)``, True at the tokens the losses count (None: all), set before a forward pass.
        attention_rows: query positions per layer and pass that the divergence samples; 0: none computed.
        active: the index of the one layer whose random-feature attention runs (layer-by-layer transfer):
            the others pass the softmax output on without computing theirs, and the forward pass stops
            after it; None: every layer runs.
        generator: draws the sampled query positions.
    """

    def __init__(self, layers: list[nn.Module]) -> None:
        self.layers = layers
        self._index = {id(layer): i for i, layer in enumerate(layers)}
        self.values: list[torch.Tensor | None] = [None] * len(layers)
        self.divergences: list[torch.Tensor | None] = [None] * len(layers)
        self.keep: torch.Tensor | None = None
        self.attention_rows = 0
        self.active: int | None = None
        self.generator = torch.Generator().manual_seed(0)

    def runs(self, layer: nn.Module) -> bool:
        """Whether ``layer`` computes its random-feature attention in this pass (see ``active``)."""
        return self.active is None or self._index[id(layer)] == self.active

    def keep_for(self, student: torch.Tensor, token_dim: int) -> torch.Tensor | None:
        """``keep`` if it fits this call's ``(B, N)``, else None (a call on other tokens: all count)."""
        keep = self.keep
        if keep is not None and keep.shape != (student.shape[0], student.shape[token_dim]):
            return None
        return keep

    def sampled_rows(self, n: int) -> torch.Tensor | None:
        """``min(attention_rows, n)`` distinct query positions in ``[0, n)``, or None when none are asked."""
        if not self.attention_rows:
            return None
        return torch.randperm(n, generator=self.generator)[: self.attention_rows].sort().values

    def record(
        self,
        layer: nn.Module,
        student: torch.Tensor,
        teacher: torch.Tensor,
        keep: torch.Tensor | None,
        token_dim: int,
        divergence: torch.Tensor | None = None,
    ) -> None:
        """Store ``layer``'s MSE and divergence (only these scalars stay, with the graph autograd needs).

        Raises:
            _ActiveLayerDone: ``layer`` is the active one of a layer-by-layer pass (nothing after it runs).
        """
        index = self._index[id(layer)]
        self.values[index] = masked_mse(student, teacher, keep, token_dim)
        self.divergences[index] = divergence
        if self.active == index:
            raise _ActiveLayerDone

    def clear(self) -> None:
        """Forget the last pass's losses."""
        self.values = [None] * len(self.layers)
        self.divergences = [None] * len(self.layers)

    def total(self, attention_weight: float = 0.0) -> torch.Tensor:
        """The summed MSE plus ``attention_weight`` times the summed divergences (the stage-1 objective)."""
        recorded = [v for v in self.values if v is not None]
        if not recorded:
            raise ValueError("model: no random-feature attention layer ran in the forward pass")
        total = torch.stack(recorded).sum()
        divergences = [d for d in self.divergences if d is not None]
        if attention_weight and divergences:
            total = total + attention_weight * torch.stack(divergences).sum()
        return total

    def floats(self) -> tuple[float, ...]:
        """The recorded MSEs as floats (NaN for a layer that did not run)."""
        return tuple(math.nan if v is None else float(v.detach()) for v in self.values)


class _ActiveLayerDone(Exception):
    """Raised by the active layer of a layer-by-layer pass once its loss is recorded: the pass ends there."""


def attention_weight_divergence(
    q: torch.Tensor,
    k: torch.Tensor,
    feature_map: rf_features.FeatureMap,
    rows: torch.Tensor,
    *,
    causal: bool,
    keep: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    r"""$\mathrm{KL}(P \,\|\, A)$ of softmax's attention weights $P$ and the map's $A$, on sampled rows.

    $P_{ij} = \operatorname{softmax}_j(s\, q_i \cdot k_j)$ ($s$ = ``scale``, $D_h^{-1/2}$ by default) and
    $A_{ij} = \phi(q_i) \cdot \phi(k_j) / \sum_{j'} \phi(q_i) \cdot \phi(k_{j'})$ with the features of
    [`rf_attention`][rf_attention.rf_attention] (inputs scaled by $\sqrt{s}$ each), over the keys each row may
    see (causal, padding). Hedgehog's cross-entropy $-\sum_j P_{ij} \log A_{ij}$ less the teacher's entropy:
    the same gradient, and 0 at a perfect match. Computed in log space with stabilizers that cancel, so
    peaked rows neither overflow nor lose their small weights to underflow before the logarithm.

    Args:
        q: ``(B, H, N, Dh)`` queries (as given to ``rf_attention``).
        k: ``(B, H, N, Dh)`` keys.
        feature_map: the layer's map, run with its current statistics (running ones are not updated).
        rows: ``(r,)`` query positions; the mean is over them (padded ones and those with no visible key
            left out), the batch and the heads.
        causal: row ``i`` sees keys ``j <= i``.
        keep: bool ``(B, N)``, True at tokens (padding neither queries nor is attended to), or None.
        scale: the logit scale of ``q . k`` (default ``Dh ** -0.5``), as ``rf_attention``'s.

    Returns:
        A scalar (with its graph in grad mode).

    Raises:
        ValueError: the features have signs (TrigRF's), so the weights ``A`` are no distribution.
    """
    n, head_dim = k.shape[-2], k.shape[-1]
    work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    q, k = q.to(work), k.to(work)
    rows = rows.to(q.device)
    keep = None if keep is None else keep.to(q.device)
    padding = None if keep is None else ~keep
    logit_scale = head_dim**-0.5 if scale is None else scale
    scale = input_scale(head_dim, scale)
    frozen = feature_map.statistics_frozen
    feature_map.statistics_frozen = True  # the forward pass already updated the running statistics
    try:
        contract = feature_map.contract(
            q, k, scale=scale, key_padding_mask=padding, query_padding_mask=padding, closed_form=False
        )
    finally:
        feature_map.statistics_frozen = frozen
    q_rows = q[..., rows, :]
    log_q = _log_features(feature_map, contract, q_rows, is_query=True)  # (B, H, r, m)
    log_k = _log_features(feature_map, contract, k, is_query=False)  # (B, H, N, m)
    allowed = torch.ones(len(rows), n, dtype=torch.bool, device=q.device)
    if causal:
        allowed = allowed & (torch.arange(n, device=q.device) <= rows.unsqueeze(-1))
    allowed = allowed.expand(q.shape[0], 1, len(rows), n)
    if keep is not None and padding is not None:
        allowed = allowed & keep[:, None, None, :]
        log_k = log_k.masked_fill(padding[:, None, :, None], -math.inf)
    # log sum_f exp(log_q[i, f] + log_k[j, f]) by one product of stabilized exponentials
    key_top = finite_or_zero(log_k.detach().amax(dim=-2, keepdim=True))  # (B, H, 1, m)
    shifted = log_q + key_top
    query_top = finite_or_zero(shifted.detach().amax(dim=-1, keepdim=True))  # (B, H, r, 1)
    products = torch.exp(shifted - query_top) @ torch.exp(log_k - key_top).mT
    student = products.clamp_min(torch.finfo(work).tiny).log() + query_top
    teacher = (q_rows @ k.mT) * logit_scale
    log_a = torch.log_softmax(student.masked_fill(~allowed, -math.inf), dim=-1)
    log_p = torch.log_softmax(teacher.masked_fill(~allowed, -math.inf), dim=-1)
    terms = torch.where(allowed, log_p.exp() * (log_p - log_a), 0.0).sum(-1)  # (B, H, r)
    valid = allowed.any(-1)
    if keep is not None:
        valid = valid & keep[:, None, rows]
    valid = valid.expand_as(terms)
    return torch.where(valid, terms, 0.0).sum() / valid.sum().clamp_min(1)


def _log_features(
    feature_map: rf_features.FeatureMap,
    contract: rf_features.FeatureContract,
    x: torch.Tensor,
    *,
    is_query: bool,
) -> torch.Tensor:
    """``log phi(x)`` ``(..., n, m)`` of non-negative features (a multiplier's logarithm added)."""
    assert contract.log_features is not None, "asked for the callable"
    log_x, multiplier = contract.log_features(x, is_query)
    if multiplier is not None:
        if bool((multiplier < 0).any()):
            raise ValueError(
                f"attention_weight: {type(feature_map).__name__}'s features have signs, so its attention "
                "weights are no distribution to compare with softmax's; use attention_weight=0"
            )
        log_x = log_x + multiplier.log()
    return log_x.expand(*x.shape[:-1], contract.width)


def feature_maps(model: nn.Module) -> list[rf_features.FeatureMap]:
    """Every ``rf_features.FeatureMap`` in ``model``, in module order."""
    return [m for m in model.modules() if isinstance(m, rf_features.FeatureMap)]


def feature_map_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The tensors of ``model``'s feature maps (weight matrices, input maps): what stage 1 trains."""
    seen: dict[int, nn.Parameter] = {}
    for fm in feature_maps(model):
        for p in fm.parameters():
            seen.setdefault(id(p), p)
    return list(seen.values())


def freeze_statistics(model: nn.Module, frozen: bool = True) -> int:
    """Keep (or let move again) the running statistics of every feature map of ``model`` in training.

    Call it before LoRA fine-tuning: an adapter saves only its own tensors, so statistics that moved in
    training would be lost on reload. Returns the number of feature maps.
    """
    maps = feature_maps(model)
    for fm in maps:
        fm.statistics_frozen = frozen
    return len(maps)


def _hf_attention_name(model: nn.Module) -> str | None:
    """The ``"rf-*"`` ``attn_implementation`` of an HF model, else None."""
    name = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return name if isinstance(name, str) and name.startswith("rf-") else None


def attention_layers(model: nn.Module) -> list[nn.Module]:
    """The random-feature attention layers of ``model``, in module order.

    ``RandomFeatureAttention`` modules, and for an HF model with an ``"rf-*"`` implementation its attention
    modules (their feature maps attached by ``rf_attention.hf.attach_feature_maps`` if none has one yet:
    attaching again would restore maps saved in the model's folder over the ones trained since).
    """
    attached = any(hasattr(m, "rf_feature_map") for m in model.modules())
    if _hf_attention_name(model) is not None and not attached:
        import rf_attention.hf as rf_hf  # the optional extra

        rf_hf.attach_feature_maps(model)
    return [
        m for m in model.modules() if isinstance(m, RandomFeatureAttention) or hasattr(m, "rf_feature_map")
    ]


@contextlib.contextmanager
def teacher_forced(model: nn.Module) -> Iterator[LayerLosses]:
    """Within: every RF attention layer records its MSE against softmax and passes the softmax output on.

    One hook for every kind of layer: each attention layer gets a `_Teacher` under
    [`TEACHER_HOOK`][rf_attention.modules.TEACHER_HOOK], which
    [`layer_attention`][rf_attention.modules.layer_attention] (the forward pass of the modules and of the
    Hugging Face attention alike) hands its heads ``q, k, v`` and its random-feature computation. The
    softmax output is computed on those ``q, k, v`` without gradient, with the same causality, key padding,
    packed sequences and logit scale; the layer's loss is the MSE of its attention output (before the output
    projection) over the kept tokens (``LayerLosses.keep``, else the layer's key padding mask). Only the
    scalar loss stays: one extra softmax output per layer lives only while its layer runs. The hooks are
    removed on exit. Forward passes with a decoding cache (HF's ``use_cache``) do not reach the hook:
    transfer runs full sequences.

    Yields:
        The [`LayerLosses`][rf_attention.transfer.LayerLosses] filled by each forward pass.
    """
    layers = attention_layers(model)
    if not layers:
        raise ValueError(
            "model: no random-feature attention layer found (RandomFeatureAttention modules, or an HF model "
            "whose attn_implementation is an 'rf-*' name)"
        )
    losses = LayerLosses(layers)
    teacher = _Teacher(losses)
    for layer in layers:
        setattr(layer, TEACHER_HOOK, teacher)
    try:
        yield losses
    finally:
        for layer in layers:
            delattr(layer, TEACHER_HOOK)


class _Teacher:
    """The hook of `teacher_forced`: softmax's output goes on, the layer's losses against it are recorded."""

    def __init__(self, losses: LayerLosses) -> None:
        self.losses = losses

    def __call__(
        self,
        layer: nn.Module,
        student: Callable[[], torch.Tensor],
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool,
        key_padding_mask: torch.Tensor | None,
        cu_seqlens: torch.Tensor | None,
        scale: float | None,
    ) -> torch.Tensor:
        """Softmax attention of ``q, k, v (B, H, N, Dh)``; ``layer``'s ``student()`` recorded against it."""
        losses = self.losses
        with torch.no_grad():
            teacher = softmax_attention(
                q, k, v, causal=causal, key_padding_mask=key_padding_mask, cu_seqlens=cu_seqlens, scale=scale
            )
        if not losses.runs(layer):
            return teacher
        out = student()
        keep = losses.keep_for(out, token_dim=2)
        if keep is None and key_padding_mask is not None:
            keep = ~key_padding_mask
        rows = losses.sampled_rows(q.shape[-2])
        divergence = None
        if rows is not None and cu_seqlens is None:
            divergence = attention_weight_divergence(
                q, k, _layer_feature_map(layer), rows, causal=causal, keep=keep, scale=scale
            )
        losses.record(layer, out, teacher.to(out.dtype), keep, 2, divergence)
        return teacher.to(out.dtype)


@contextlib.contextmanager
def _only_feature_maps_train(model: nn.Module, parameters: list[nn.Parameter]) -> Iterator[None]:
    """Gradients for ``parameters`` only, every module in eval; flags and modes restored on exit."""
    requires = {id(p): p.requires_grad for p in model.parameters()}
    modes = {id(m): m.training for m in model.modules()}
    train = {id(p) for p in parameters}
    for p in model.parameters():
        p.requires_grad_(id(p) in train)
    model.eval()
    try:
        yield
    finally:
        for p in model.parameters():
            p.requires_grad_(requires[id(p)])
        for m in model.modules():
            m.train(modes[id(m)])


def _forward(model: nn.Module, batch: Batch, device: torch.device, losses: LayerLosses) -> None:
    """One forward pass of ``batch``; ``losses.keep`` from its ``attention_mask`` (1 at tokens)."""
    options: dict[str, Any] = {"use_cache": False} if _hf_attention_name(model) is not None else {}
    losses.clear()
    if isinstance(batch, torch.Tensor):
        losses.keep = None
        with contextlib.suppress(_ActiveLayerDone):
            model(batch.to(device), **options)
        return
    if not isinstance(batch, Mapping):
        raise ValueError(
            f"batches: expected input_ids tensors (B, N) or dicts of model inputs, got {type(batch)}"
        )
    inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    mask = inputs.get("attention_mask")
    losses.keep = None if mask is None else mask.bool()
    with contextlib.suppress(_ActiveLayerDone):
        model(**inputs, **options)


def _evaluate(model: nn.Module, batch: Batch, device: torch.device, losses: LayerLosses) -> tuple[float, ...]:
    with torch.no_grad():
        _forward(model, batch, device, losses)
    return losses.floats()


def _batches(batches: Iterable[Batch]) -> Iterator[Batch]:
    """``batches`` over and over when it can be iterated again (a list, a DataLoader), else once."""
    while True:
        iterator = iter(batches)
        yielded = False
        for batch in iterator:
            yielded = True
            yield batch
        if not yielded or iterator is batches:
            return


#: Learning-rate schedules of `attention_transfer`: after the warmup, constant or a cosine decay to 0.
SCHEDULES = ("constant", "cosine")


def learning_rate_factor(step: int, steps: int, schedule: str, warmup_steps: int) -> float:
    """The factor of the peak learning rate at ``step`` (from 0) of ``steps``.

    Linear warmup over the first ``warmup_steps`` (from ``1 / warmup_steps``), then 1 (``"constant"``) or
    half a cosine period from 1 down to 0 at ``steps`` (``"cosine"``).
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def attention_transfer(
    model: nn.Module,
    batches: Iterable[Batch],
    *,
    steps: int,
    lr: float = DEFAULT_LR,
    schedule: str = "cosine",
    warmup: float = 0.1,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = 1.0,
    attention_weight: float = DEFAULT_ATTENTION_WEIGHT,
    attention_rows: int = 32,
    layerwise: bool = False,
) -> TransferReport:
    r"""Stage 1: train only the feature maps, so each attention layer matches softmax on its ``q, k, v``.

    The objective is the sum over layers of the per-layer MSE between random-feature and softmax attention
    outputs, plus ``attention_weight`` times the divergence of their attention weights on
    ``attention_rows`` sampled query positions
    ([`attention_weight_divergence`][rf_attention.transfer.attention_weight_divergence], Hedgehog's
    loss), with the softmax output passed on to the next layer
    ([`teacher_forced`][rf_attention.transfer.teacher_forced]), minimized by AdamW over
    [`feature_map_parameters`][rf_attention.transfer.feature_map_parameters] only. Every other parameter is
    frozen (and bit-identical afterwards); ``requires_grad`` flags and train/eval modes are restored. The
    model runs in eval mode (no dropout) except its feature maps, whose running statistics (OPRF, SADERF)
    follow the data. The defaults are those measured best on a peaked teacher (the guide "Linearizing a
    pretrained model").

    Maps whose features have signs (TrigRF's) are refused: their normalizer can come arbitrarily near 0,
    and the transfer diverges on the unbounded outputs there.

    Args:
        model: a model whose attention layers are RF with learnable feature maps.
        batches: ``input_ids`` tensors ``(B, N)``, or dicts of the model's keyword arguments; an
            ``attention_mask`` (1 at tokens, 0 at padding) excludes padded positions from the loss. Cycled
            when it can be iterated again, until ``steps``.
        steps: optimizer steps (per layer with ``layerwise``).
        lr: AdamW's peak learning rate.
        schedule: ``"cosine"`` or ``"constant"`` after the warmup
            ([`learning_rate_factor`][rf_attention.transfer.learning_rate_factor]).
        warmup: the share of ``steps`` with a linear warmup (0: none).
        weight_decay: AdamW weight decay.
        max_grad_norm: gradient clipping of the feature-map parameters (None: none). A step whose
            gradient is not finite is skipped (``report.skipped_steps``).
        attention_weight: weight of the attention-weight divergence (0: output MSE only).
        attention_rows: query positions per layer and step that the divergence samples (its cost is
            ``attention_rows x N`` per head, not ``N x N``).
        layerwise: train the layers one after the other, ``steps`` each, with a forward pass that runs the
            random-feature attention of the one layer in training only and stops after it: the memory of
            one layer's graph, for models whose every layer's graph does not fit at once.

    Returns:
        A [`TransferReport`][rf_attention.transfer.TransferReport]: per-layer MSE on the first batch before
        and after, the steps taken and the loss of each step.
    """
    check_int("steps", steps, minimum=0)
    check_int("attention_rows", attention_rows)
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {SCHEDULES}, got {schedule!r}")
    if not 0.0 <= warmup <= 1.0:
        raise ValueError(f"warmup: expected a share of the steps in [0, 1], got {warmup}")
    if attention_weight < 0:
        raise ValueError(f"attention_weight: expected a non-negative weight, got {attention_weight}")
    layers = attention_layers(model)  # an HF model's feature maps are attached here, before any optimizer
    parameters = feature_map_parameters(model)
    if not parameters:
        raise ValueError(
            "model: its feature maps have no parameters to train; create the attention with learnable=True"
            if attention_layers(model)
            else "model: no random-feature attention layer to train; convert it first with rf_attention.hf."
            "linearize(model, 'posrf-orf') (HF models) or rf_attention.create(..., learnable=True)"
        )
    for fm in feature_maps(model):
        _check_unsigned(fm)
    device = parameters[0].device
    stream = _batches(batches)
    first = next(stream, None)
    if first is None:
        raise ValueError("batches: expected at least one batch, got none")
    history: list[float] = []
    skipped = 0
    with _only_feature_maps_train(model, parameters), teacher_forced(model) as losses:
        names = {id(m): n for n, m in model.named_modules()}
        before = _evaluate(model, first, device, losses)
        groups = (
            [(i, list(_layer_feature_map(layer).parameters())) for i, layer in enumerate(layers)]
            if layerwise
            else []
        )
        warmup_steps = math.ceil(warmup * steps)
        rounds = [(index, group) for index, group in groups if group] if layerwise else [(None, parameters)]
        batch: Batch | None = first
        for active, trained in rounds:
            losses.active = active
            optimizer = torch.optim.AdamW(trained, lr=lr, weight_decay=weight_decay)
            scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer,
                functools.partial(
                    learning_rate_factor, steps=steps, schedule=schedule, warmup_steps=warmup_steps
                ),
            )
            taken = 0
            while batch is not None and taken < steps:
                for fm in feature_maps(model):
                    fm.train()
                losses.attention_rows = attention_rows if attention_weight else 0
                _forward(model, batch, device, losses)
                losses.attention_rows = 0
                total = losses.total(attention_weight)
                if not total.requires_grad:
                    raise ValueError(
                        "batches: no attention output depends on the feature maps (each layer's window "
                        "covers every position of these sequences), so there is nothing to transfer; "
                        "use sequences longer than the window"
                    )
                optimizer.zero_grad(set_to_none=True)
                total.backward()
                norm = torch.nn.utils.clip_grad_norm_(trained, max_grad_norm or math.inf)
                if bool(torch.isfinite(norm)):
                    optimizer.step()
                else:  # float32 ran out of range in this batch's features: the maps stay as they were
                    skipped += 1
                scheduler.step()
                history.append(float(total.detach()))
                taken += 1
                for fm in feature_maps(model):
                    fm.eval()
                batch = next(stream, None)
        losses.active = None
        after = _evaluate(model, first, device, losses)
        names_of_layers = tuple(names[id(layer)] for layer in losses.layers)
    return TransferReport(names_of_layers, before, after, len(history), tuple(history), skipped)


def _layer_feature_map(layer: nn.Module) -> rf_features.FeatureMap:
    """The feature map of an attention layer of `attention_layers` (a module's, or an HF module's)."""
    fm = layer.feature_map if isinstance(layer, RandomFeatureAttention) else layer.rf_feature_map
    if not isinstance(fm, rf_features.FeatureMap):
        raise ValueError(f"layer: expected a feature map on {type(layer).__name__}, got {type(fm).__name__}")
    return fm


def _check_unsigned(fm: rf_features.FeatureMap) -> None:
    """Refuse to transfer a map whose features can be negative (TrigRF's waves, negative quadrature weights).

    Its normalizer ``sum_j phi(q) . phi(k_j)`` has no sign guarantee: where it nears 0 the output has no
    bound, those few rows dominate the MSE and its gradient, and training follows them (a layer's MSE can
    grow by orders of magnitude while another's falls); its attention weights are no distribution either.
    """
    if isinstance(fm, rf_features.TrigRF) or fm.weight_matrix.signed_weights:
        raise ValueError(
            f"model: its {type(fm).__name__} feature map over {type(fm.weight_matrix).__name__} has features "
            "with signs, whose attention normalizer can come arbitrarily near 0: outputs without bound "
            "dominate the transfer loss and training diverges; transfer a pair with positive features "
            "(posrf, oprf, saderf, gerf, posrf-hyp, or a learned map) instead"
        )


def lora_config(
    model: nn.Module, *, r: int = 8, alpha: int = 16, dropout: float = 0.0, **kw: Any
) -> LoraConfig:
    """A ``peft.LoraConfig`` for stage 2 whose adapters target the RF attention layers' projections.

    The targets are the full names of the ``nn.Linear`` (or GPT-2 ``Conv1D``) children of every attention
    layer (``qkv``/``proj`` of ``rf_attention`` modules, ``q_proj``...``o_proj`` of Llama-style models), so
    the MLPs keep their weights. The feature maps are neither adapted nor saved by the adapter: save the
    model after stage 1 (its state dict holds the learned maps), call
    [`freeze_statistics`][rf_attention.transfer.freeze_statistics], then
    ``peft.get_peft_model(model, lora_config(model))`` and train with ``transformers.Trainer`` or any loop.

    Args:
        model: the model after stage 1.
        r: LoRA rank.
        alpha: LoRA scaling ``alpha / r``.
        dropout: dropout on the adapters' inputs.
        **kw: more ``peft.LoraConfig`` arguments (e.g. ``task_type="CAUSAL_LM"``).
    """
    from peft import LoraConfig

    projection_types: tuple[type[nn.Module], ...] = (nn.Linear, *_conv1d_types())
    names = {id(m): n for n, m in model.named_modules()}
    targets = [
        f"{names[id(layer)]}.{child}" if names[id(layer)] else child
        for layer in attention_layers(model)
        for child, module in layer.named_children()
        if isinstance(module, projection_types)
    ]
    if not targets:
        raise ValueError("model: its attention layers have no linear projections to adapt")
    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, **kw)


def _conv1d_types() -> tuple[type[nn.Module], ...]:
    """The GPT-2 ``Conv1D`` of transformers, when it is installed."""
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:
        return ()
    return (Conv1D,)
