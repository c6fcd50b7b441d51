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
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

import rf_features
from rf_attention.functional import softmax_attention
from rf_attention.modules import RandomFeatureAttention
from spectraformer_core import check_int

if TYPE_CHECKING:
    from peft import LoraConfig

#: The ``attn_implementation`` name under which an HF model runs during `teacher_forced`.
HF_TRANSFER_NAME = "rf-attention-transfer"

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
        losses: the summed per-layer MSE of each training step.
    """

    layers: tuple[str, ...]
    mse_before: tuple[float, ...]
    mse_after: tuple[float, ...]
    steps: int
    losses: tuple[float, ...]


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
    """Each attention layer's MSE against softmax in the last forward pass under `teacher_forced`.

    Attributes:
        layers: the attention modules, in the model's order.
        values: per layer, the scalar MSE (with its graph in grad mode), or None if the layer did not run.
        keep: bool ``(B, N)``, True at the tokens the losses count (None: all), set before a forward pass.
    """

    def __init__(self, layers: list[nn.Module]) -> None:
        self.layers = layers
        self._index = {id(layer): i for i, layer in enumerate(layers)}
        self.values: list[torch.Tensor | None] = [None] * len(layers)
        self.keep: torch.Tensor | None = None

    def record(
        self,
        layer: nn.Module,
        student: torch.Tensor,
        teacher: torch.Tensor,
        keep: torch.Tensor | None,
        token_dim: int,
    ) -> None:
        """Store ``layer``'s MSE (only this scalar stays, with the graph autograd needs for it)."""
        if keep is not None and keep.shape != (student.shape[0], student.shape[token_dim]):
            keep = None  # a call on other tokens (packed or cached): every token counts
        self.values[self._index[id(layer)]] = masked_mse(student, teacher, keep, token_dim)

    def clear(self) -> None:
        """Forget the last pass's losses."""
        self.values = [None] * len(self.layers)

    def total(self) -> torch.Tensor:
        """The sum of the recorded losses (the stage-1 objective)."""
        recorded = [v for v in self.values if v is not None]
        if not recorded:
            raise ValueError("model: no random-feature attention layer ran in the forward pass")
        return torch.stack(recorded).sum()

    def floats(self) -> tuple[float, ...]:
        """The recorded losses as floats (NaN for a layer that did not run)."""
        return tuple(math.nan if v is None else float(v) for v in self.values)


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

    The softmax output is computed on the layer's own ``q, k, v`` without gradient; the layer's loss is the
    MSE of its attention output (before the output projection) over the kept tokens
    (``LayerLosses.keep``, else the layer's key padding mask). Only the scalar loss stays: one extra softmax
    output per layer lives only while its layer runs. The model is restored on exit.

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
    with contextlib.ExitStack() as stack:
        for layer in layers:
            if isinstance(layer, RandomFeatureAttention):
                stack.enter_context(_module_teacher(layer, losses))
        hf_name = _hf_attention_name(model)
        if hf_name is not None:
            stack.enter_context(_hf_teacher(model, hf_name, losses))
        yield losses


@contextlib.contextmanager
def _module_teacher(layer: RandomFeatureAttention, losses: LayerLosses) -> Iterator[None]:
    """``layer.attend`` records its MSE against softmax and returns the softmax output (restored on exit)."""
    student_attend = layer.attend

    def attend(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None
    ) -> torch.Tensor:
        student = student_attend(q, k, v, key_padding_mask)
        with torch.no_grad():
            teacher = softmax_attention(q, k, v, causal=layer.causal, key_padding_mask=key_padding_mask)
        keep = losses.keep
        if keep is None and key_padding_mask is not None:
            keep = ~key_padding_mask
        losses.record(layer, student, teacher, keep, token_dim=2)
        return teacher.to(student.dtype)

    layer.attend = attend  # type: ignore[method-assign]  # an instance attribute, deleted on exit
    try:
        yield
    finally:
        del layer.attend


@contextlib.contextmanager
def _hf_teacher(model: nn.Module, name: str, losses: LayerLosses) -> Iterator[None]:
    """The HF model runs `HF_TRANSFER_NAME`: its RF function recorded against SDPA, whose output goes on."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    student_attention: Callable[..., tuple[torch.Tensor, Any]] = AttentionInterface()[name]  # type: ignore[no-untyped-call]

    def attention(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        student, _ = student_attention(module, query, key, value, attention_mask, **kwargs)
        with torch.no_grad():
            teacher, _ = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        losses.record(module, student, teacher, losses.keep, token_dim=1)
        return teacher.to(student.dtype), None

    AttentionInterface.register(HF_TRANSFER_NAME, attention)
    AttentionMaskInterface.register(HF_TRANSFER_NAME, sdpa_mask)
    set_implementation: Callable[[str], None] = getattr(model, "set_attn_implementation")  # noqa: B009
    set_implementation(HF_TRANSFER_NAME)
    try:
        yield
    finally:
        set_implementation(name)


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
        model(batch.to(device), **options)
        return
    if not isinstance(batch, Mapping):
        raise ValueError(
            f"batches: expected input_ids tensors (B, N) or dicts of model inputs, got {type(batch)}"
        )
    inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    mask = inputs.get("attention_mask")
    losses.keep = None if mask is None else mask.bool()
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


def attention_transfer(
    model: nn.Module,
    batches: Iterable[Batch],
    *,
    steps: int,
    lr: float = 1e-2,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = 1.0,
) -> TransferReport:
    r"""Stage 1: train only the feature maps, so each attention layer matches softmax on its ``q, k, v``.

    The objective is the sum over layers of the per-layer MSE between random-feature and softmax attention
    outputs, with the softmax output passed on to the next layer
    ([`teacher_forced`][rf_attention.transfer.teacher_forced]), minimized by AdamW over
    [`feature_map_parameters`][rf_attention.transfer.feature_map_parameters] only. Every other parameter is
    frozen (and bit-identical afterwards); ``requires_grad`` flags and train/eval modes are restored. The
    model runs in eval mode (no dropout) except its feature maps, whose running statistics (OPRF, SADERF)
    follow the data.

    Args:
        model: a model whose attention layers are RF with learnable feature maps.
        batches: ``input_ids`` tensors ``(B, N)``, or dicts of the model's keyword arguments; an
            ``attention_mask`` (1 at tokens, 0 at padding) excludes padded positions from the loss. Cycled
            when it can be iterated again, until ``steps``.
        steps: optimizer steps.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        max_grad_norm: gradient clipping of the feature-map parameters (None: none).

    Returns:
        A [`TransferReport`][rf_attention.transfer.TransferReport]: per-layer MSE on the first batch before
        and after, the steps taken and the loss of each step.
    """
    check_int("steps", steps, minimum=0)
    attention_layers(model)  # an HF model's feature maps are attached here, before the optimizer is built
    parameters = feature_map_parameters(model)
    if not parameters:
        raise ValueError(
            "model: its feature maps have no parameters to train; create the attention with learnable=True"
            if attention_layers(model)
            else "model: no random-feature attention layer to train; convert it first with rf_attention.hf."
            "linearize(model, 'posrf-orf') (HF models) or rf_attention.create(..., learnable=True)"
        )
    device = parameters[0].device
    stream = _batches(batches)
    first = next(stream, None)
    if first is None:
        raise ValueError("batches: expected at least one batch, got none")
    history: list[float] = []
    with _only_feature_maps_train(model, parameters), teacher_forced(model) as losses:
        names = {id(m): n for n, m in model.named_modules()}
        before = _evaluate(model, first, device, losses)
        optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay)
        batch: Batch | None = first
        while batch is not None and len(history) < steps:
            for fm in feature_maps(model):
                fm.train()
            _forward(model, batch, device, losses)
            total = losses.total()
            optimizer.zero_grad(set_to_none=True)
            total.backward()
            if max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm)
            optimizer.step()
            history.append(float(total.detach()))
            for fm in feature_maps(model):
                fm.eval()
            batch = next(stream, None)
        after = _evaluate(model, first, device, losses)
        layers = tuple(names[id(layer)] for layer in losses.layers)
    return TransferReport(layers, before, after, len(history), tuple(history))


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
