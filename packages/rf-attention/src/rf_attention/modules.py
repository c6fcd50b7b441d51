"""Multi-head self-attention modules: the shared projections, exact softmax, and random-feature attention."""

from __future__ import annotations

import functools
import math
import weakref
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

import rf_features
from rf_attention import varlen
from rf_attention.decoding import KVCache, RecurrentState, decode_heads
from rf_attention.functional import rf_attention, softmax_attention
from rf_attention.ops.triton import check_backend
from spectraformer_core import check_int

#: Added to ``seed`` for the projections' generator, so that they and a feature map drawn from the same
#: ``seed`` come from different streams.
PROJECTION_SEED_OFFSET = 0x5EED_0F_7A0


#: The modules with periodic redraws, by ``id``: `redraw_features_if_due` finds its module here.
_REDRAWING: weakref.WeakValueDictionary[int, RandomFeatureAttention] = weakref.WeakValueDictionary()


@torch.library.custom_op("rf_attention::redraw_features_if_due", mutates_args=("state",))
def redraw_features_if_due(module_key: int, calls: torch.Tensor, state: list[torch.Tensor]) -> None:
    """Redraw the features of module ``module_key`` when training call number ``calls`` is due for it.

    One operator, opaque to ``torch.compile``: the redraw (a host-side draw from the weight matrix's
    generator) runs inside a compiled training step as one node of its graph, without a graph break, and
    the decision is read from the tensor ``calls`` when the step runs, so the graph is the same whatever the
    count (no recompilation).

    Args:
        module_key: ``id`` of the [`RandomFeatureAttention`][rf_attention.RandomFeatureAttention] module.
        calls: ``()`` int64, the module's ``training_calls`` before this call (redraw when it is a positive
            multiple of ``redraw_interval``).
        state: the weight matrix's buffers (what a redraw writes): updated in place.
    """
    module = _REDRAWING[module_key]
    count = int(calls)
    if count and count % module.redraw_interval == 0:
        matrix = module.feature_map.weight_matrix
        matrix.redraw()
        for target, drawn in zip(state, matrix.buffers(), strict=True):
            if target is not drawn:  # under torch.compile, ``state`` may hold functional copies
                target.copy_(drawn)


@redraw_features_if_due.register_fake
def _redraw_features_if_due_fake(module_key: int, calls: torch.Tensor, state: list[torch.Tensor]) -> None:
    return None


#: The attribute of an attention layer under which attention transfer puts its teacher
#: (``rf_attention.transfer.teacher_forced``; absent outside it): `layer_attention` then returns what the
#: teacher gives.
TEACHER_HOOK = "rf_teacher"


def layer_attention(
    layer: nn.Module,
    feature_map: rf_features.FeatureMap,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None = None,
    query_padding_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    window: int = 0,
    scale: float | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """The random-feature attention of one attention ``layer`` on heads ``(B, H, N, Dh)``: ``(B, H, N, Dv)``.

    The one route of the forward pass: [`RandomFeatureAttention`][rf_attention.RandomFeatureAttention]'s
    ``attend`` and the Hugging Face attention ([`rf_attention.hf`][rf_attention.hf], ``layer`` the HF
    attention module) both call it, and attention transfer trains both through it:
    [`rf_attention`][rf_attention.rf_attention] with ``layer``'s ``feature_map``, or, where
    ``layer`` carries a teacher (`TEACHER_HOOK`), what the teacher returns given these arguments and the
    student (the same call as a function of no arguments). ``scale`` is the logit scale of ``q . k``
    (default ``Dh ** -0.5``; [`input_scale`][rf_attention.functional.input_scale]).
    """
    student = functools.partial(
        rf_attention,
        q,
        k,
        v,
        feature_map,
        causal=causal,
        key_padding_mask=key_padding_mask,
        query_padding_mask=query_padding_mask,
        cu_seqlens=cu_seqlens,
        window=window,
        backend=backend,
        scale=scale,
    )
    teacher = getattr(layer, TEACHER_HOOK, None)
    if teacher is None:
        return student()
    return cast(
        torch.Tensor,
        teacher(
            layer,
            student,
            q,
            k,
            v,
            causal=causal,
            key_padding_mask=key_padding_mask,
            cu_seqlens=cu_seqlens,
            scale=scale,
        ),
    )


class MultiheadSelfAttention(nn.Module):
    r"""Multi-head self-attention ``(B, N, dim) -> (B, N, dim)``: projections around an attention kernel.

    $q, k, v = x W_{qkv}$ split into ``num_heads`` heads of ``dim / num_heads``; subclasses implement
    [`attend`][rf_attention.MultiheadSelfAttention.attend] on ``(B, H, N, Dh)`` tensors; the heads are merged
    and projected back, then dropout. Causal attentions with a recurrent form also implement
    [`prefill_heads`][rf_attention.MultiheadSelfAttention.prefill_heads] and
    [`step_heads`][rf_attention.MultiheadSelfAttention.step_heads], which
    [`prefill`][rf_attention.MultiheadSelfAttention.prefill] and
    [`step`][rf_attention.MultiheadSelfAttention.step] (token-by-token decoding) call.

    Args:
        dim: model width.
        num_heads: heads; must divide ``dim``.
        causal: query $i$ attends to positions $j \le i$ only.
        dropout: dropout on the output projection (training only; drawn from the global torch RNG).
        bias: biases in the projections.
        seed: when given, the projections' initial weights are drawn from it (PyTorch's default
            ``nn.Linear`` initialization from a seeded generator), so two modules created with the same
            seed are equal whatever the global torch seed; None: from the global torch RNG.
    """

    #: False for attentions without a causal form (``create(..., causal=True)`` then raises).
    supports_causal: bool = True
    #: True for attentions that compute attention probabilities and drop them with ``attention_dropout``
    #: (kernelized attentions have none to drop).
    supports_attention_dropout: bool = False

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        causal: bool = False,
        dropout: float = 0.0,
        bias: bool = True,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        if num_heads < 1 or dim % num_heads:
            raise ValueError(f"num_heads: expected a divisor of dim={dim}, got {num_heads}")
        if causal and not self.supports_causal:
            raise ValueError(f"causal: {type(self).__name__} has no causal form; use causal=False")
        self.dim, self.num_heads, self.head_dim, self.causal = dim, num_heads, dim // num_heads, causal
        self.qkv: nn.Module = nn.Linear(dim, 3 * dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)
        self.dropout = nn.Dropout(dropout)
        if seed is not None:
            self.reset_projections(seed)

    @torch.no_grad()
    def reset_projections(self, seed: int) -> None:
        r"""Draw every ``nn.Linear`` of ``qkv`` and ``proj`` afresh from ``seed`` (PyTorch's default init).

        Weights $\mathcal U(-b, b)$ with $b = 1 / \sqrt{\mathrm{fan\_in}}$ (``kaiming_uniform_(a=sqrt(5))``),
        biases likewise; drawn on the CPU in float32 and copied, so a seed gives the same module on every
        device and dtype.
        """
        generator = torch.Generator().manual_seed(seed + PROJECTION_SEED_OFFSET)
        for part in (self.qkv, self.proj):
            for layer in part.modules():
                if isinstance(layer, nn.Linear):
                    weight = torch.empty(layer.weight.shape)
                    nn.init.kaiming_uniform_(weight, a=math.sqrt(5), generator=generator)
                    layer.weight.copy_(weight)
                    if layer.bias is not None:
                        bound = 1 / math.sqrt(layer.in_features)
                        layer.bias.copy_(
                            torch.empty(layer.bias.shape).uniform_(-bound, bound, generator=generator)
                        )

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Attention on heads: ``q, k, v (B, H, N, Dh)`` -> ``(B, H, N, Dh)``."""
        raise NotImplementedError

    def prefill_heads(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        key_padding_mask: torch.Tensor | None,
        ends: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Any]:
        """Causal attention on heads ``(B, H, N, Dh)`` and the decoding state after the ``N`` positions.

        ``ends`` ``(B,)``: right-padded packed prompts end there (the next token follows each row's own
        last token), or None (at ``N``).
        """
        raise NotImplementedError(f"{type(self).__name__} has no recurrent (token-by-token) form")

    def step_heads(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Any
    ) -> tuple[torch.Tensor, Any]:
        """Attention of ``T`` new positions ``(B, H, T, Dh)`` continuing ``state`` (None: from the start)."""
        raise NotImplementedError(f"{type(self).__name__} has no recurrent (token-by-token) form")

    def attend_cross(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        context_padding_mask: torch.Tensor | None,
        query_padding_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Cross-attention on heads: ``q (B, H, N, Dh)`` over ``k, v (B, H, M, Dh)`` -> ``(B, H, N, Dh)``."""
        raise NotImplementedError(f"{type(self).__name__} has no cross-attention form")

    def forward(
        self,
        x: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        *,
        context: torch.Tensor | None = None,
        context_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Self-attention of ``x``, or cross-attention of ``x``'s queries over ``context``.

        Args:
            x: ``(B, N, dim)``.
            key_padding_mask: bool ``(B, N)``, True at padding of ``x`` (its keys in self-attention; in
                cross-attention its queries, whose rows give zeros' projection and are left out of the
                feature map's statistics).
            context: ``(B, M, dim)``: keys and values come from it (cross-attention: queries from ``x``,
                the same ``qkv`` projection weights; the module must be non-causal).
            context_padding_mask: bool ``(B, M)``, True at padding of ``context``.

        Returns:
            ``(B, N, dim)``.
        """
        if context is None:
            if context_padding_mask is not None:
                raise ValueError("context_padding_mask: given without a context")
            q, k, v = self._heads(x, key_padding_mask)
            return self._merge(self.attend(q, k, v, key_padding_mask))
        if self.causal:
            raise ValueError(
                f"context: {type(self).__name__} was created with causal=True; cross-attention needs "
                "causal=False (queries and keys come from different sequences)"
            )
        q, k, v = self._cross_heads(x, key_padding_mask, context, context_padding_mask)
        return self._merge(self.attend_cross(q, k, v, context_padding_mask, key_padding_mask))

    def prefill(
        self,
        x: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        *,
        cu_seqlens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Any]:
        """The causal forward pass of a prefix and the decoding state it leaves, for ``step``.

        Args:
            x: ``(B, N, dim)``, the prompt; with ``cu_seqlens``, ``(1, T, dim)``: ``S`` prompts packed.
            key_padding_mask: bool ``(B, N)``, True at padding (e.g. left padding of prompts of unequal
                length): padded positions are never attended to, now or in later steps.
            cu_seqlens: ``(S + 1,)`` cumulative starts of the packed prompts
                ([`rf_attention.varlen`][rf_attention.varlen]). The state then has ``S`` rows, one per
                prompt (a ``RecurrentState``'s ``length`` is the ``(S,)`` prompt lengths), and ``step``
                continues all of them with ``(S, 1, dim)`` tokens.

        Returns:
            ``(y (B, N, dim), state)``, ``y`` equal to ``forward(x, key_padding_mask)`` (with
            ``cu_seqlens``: ``y (1, T, dim)``, each prompt's outputs as if alone).
        """
        self._check_decodes("prefill")
        if cu_seqlens is None:
            q, k, v = self._heads(x, key_padding_mask)
            out, state = self.prefill_heads(q, k, v, key_padding_mask)
            return self._merge(out), state
        if key_padding_mask is not None or x.shape[0] != 1:
            raise ValueError(
                "cu_seqlens: expected packed prompts x of shape (1, T, dim) and no key_padding_mask, got "
                f"x {tuple(x.shape)} and a mask {key_padding_mask is not None}"
            )
        layout = varlen.PackedLayout.from_cu_seqlens(cu_seqlens, x.shape[1])
        q, k, v = (layout.unpack(t) for t in self._heads(x, None))
        out, state = self.prefill_heads(q, k, v, layout.padding.to(x.device), ends=layout.lengths)
        if isinstance(state, RecurrentState):
            state.length = layout.lengths.to(x.device)
        return self._merge(layout.pack(out)), state

    def step(self, x: torch.Tensor, state: Any = None) -> tuple[torch.Tensor, Any]:
        """Decode: the outputs of the next token(s) ``x (B, 1, dim)`` given the state of the tokens before.

        In ``eval()``, feeding a sequence token by token (from ``state=None`` or from the state of
        [`prefill`][rf_attention.MultiheadSelfAttention.prefill]) gives the causal
        [`forward`][rf_attention.MultiheadSelfAttention.forward] outputs to rounding. RF attention keeps an
        O(1) state ([`RecurrentState`][rf_attention.ops.recurrent.RecurrentState], advanced by
        [`decode`][rf_attention.ops.recurrent.decode]: one token is a fused step of a few dozen
        operations), softmax attention a KV cache ([`KVCache`][rf_attention.decoding.KVCache], updated in
        place). ``x`` may hold $T > 1$ new tokens.

        Returns:
            ``(y (B, T, dim), state after the new tokens)``.
        """
        self._check_decodes("step")
        q, k, v = self._step_heads(x)
        out, state = self.step_heads(q, k, v, state)
        return self._step_merge(out), state

    def _step_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``q, k, v (B, H, T, Dh)`` of the new tokens ``x (B, T, dim)``; one token in a few views."""
        if x.dim() != 3 or x.shape[1] != 1:
            return self._heads(x, None)
        self._check_input("x", x, None, "key_padding_mask")
        b = x.shape[0]
        q, k, v = self.qkv(x.view(b, self.dim)).view(b, 3, self.num_heads, 1, self.head_dim).unbind(1)
        return q, k, v

    def _step_merge(self, out: torch.Tensor) -> torch.Tensor:
        """`_merge` of ``out (B, H, T, Dh)``; one token's heads are already in ``(B, dim)`` order."""
        b, _, n, _ = out.shape
        if n != 1:
            return self._merge(out)
        return self.dropout(self.proj(out.reshape(b, self.dim)).view(b, 1, self.dim))

    def _check_decodes(self, name: str) -> None:
        if not self.causal:
            raise ValueError(
                f"{name}: {type(self).__name__} was created with causal=False; token-by-token decoding needs "
                "a causal attention (create(..., causal=True))"
            )

    def _check_input(
        self, name: str, x: torch.Tensor, padding: torch.Tensor | None, padding_name: str
    ) -> None:
        """A ``ValueError`` unless ``x`` is ``(B, N, dim)`` of the module's dtype, ``padding`` ``(B, N)``."""
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(
                f"{name}: expected shape (B, N, {self.dim}), got {tuple(getattr(x, 'shape', ()))}"
            )
        expected = self.proj.weight.dtype
        if not x.is_floating_point():
            raise ValueError(
                f"{name}: expected a floating-point tensor ({expected}, the module's dtype), got {x.dtype}"
            )
        if x.dtype != expected and not torch.is_autocast_enabled(x.device.type):
            raise ValueError(
                f"{name}: expected dtype {expected} (the module's parameters), got {x.dtype}; cast the input "
                f"or the module (module.to({x.dtype})), or run under torch.autocast"
            )
        if padding is not None and (padding.dtype != torch.bool or padding.shape != x.shape[:2]):
            raise ValueError(
                f"{padding_name}: expected a bool tensor of shape {tuple(x.shape[:2])}, "
                f"got {padding.dtype} {tuple(padding.shape)}"
            )

    def _heads(
        self, x: torch.Tensor, key_padding_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Checked ``x (B, N, dim)`` projected to ``q, k, v (B, H, N, Dh)``."""
        self._check_input("x", x, key_padding_mask, "key_padding_mask")
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return q, k, v

    def _cross_heads(
        self,
        x: torch.Tensor,
        query_padding_mask: torch.Tensor | None,
        context: torch.Tensor,
        context_padding_mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries of ``x (B, N, dim)``, keys and values of ``context (B, M, dim)``: ``(B, H, *, Dh)``."""
        self._check_input("x", x, query_padding_mask, "key_padding_mask")
        self._check_input("context", context, context_padding_mask, "context_padding_mask")
        if context.shape[0] != x.shape[0]:
            raise ValueError(f"context: expected batch {x.shape[0]} (as x), got {context.shape[0]}")
        if not isinstance(self.qkv, nn.Linear):
            raise ValueError(
                f"context: cross-attention needs the plain qkv projection, {type(self).__name__} has "
                f"{type(self.qkv).__name__}"
            )
        weight, bias = self.qkv.weight, self.qkv.bias
        q = F.linear(x, weight[: self.dim], None if bias is None else bias[: self.dim])
        kv = F.linear(context, weight[self.dim :], None if bias is None else bias[self.dim :])
        b, n, m = x.shape[0], x.shape[1], context.shape[1]
        q = q.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        k, v = kv.view(b, m, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return q, k, v

    def _merge(self, out: torch.Tensor) -> torch.Tensor:
        """Heads ``(B, H, N, Dh)`` merged, projected and dropped out: ``(B, N, dim)``."""
        b, _, n, _ = out.shape
        return self.dropout(self.proj(out.transpose(1, 2).reshape(b, n, self.dim)))

    def _checked_window(self, window: int) -> int:
        """``window`` (a sliding window's length, 0 for none), refused unless a causal module's."""
        check_int("window", window, minimum=0)
        if window and not self.causal:
            raise ValueError(f"window: the sliding-window hybrid needs causal=True, got window={window}")
        return window

    def extra_repr(self) -> str:
        """Width, heads and causality shown by ``repr``."""
        return f"dim={self.dim}, num_heads={self.num_heads}, causal={self.causal}"


class SoftmaxAttention(MultiheadSelfAttention):
    """Exact softmax attention (the original Transformer; SDPA underneath), O(N^2).

    Args:
        attention_dropout: dropout on the attention probabilities (training only).
        window: the sliding-window hybrid's argument, accepted so that one grid of settings runs every
            attention: the hybrid weighs the last ``window`` positions exactly and earlier ones by the
            attention's estimate, which for softmax is exact too, so any window gives plain causal softmax
            (not local attention: keys before the window still count). Needs ``causal=True`` when positive.
        **kw: [`MultiheadSelfAttention`][rf_attention.MultiheadSelfAttention] arguments.
    """

    supports_attention_dropout = True

    def __init__(
        self, dim: int, num_heads: int, *, attention_dropout: float = 0.0, window: int = 0, **kw: Any
    ) -> None:
        super().__init__(dim, num_heads, **kw)
        self.attention_dropout = attention_dropout
        self.window = self._checked_window(window)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """[`softmax_attention`][rf_attention.softmax_attention]."""
        dropout_p = self.attention_dropout if self.training else 0.0
        return softmax_attention(
            q, k, v, causal=self.causal, key_padding_mask=key_padding_mask, dropout_p=dropout_p
        )

    def attend_cross(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        context_padding_mask: torch.Tensor | None,
        query_padding_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """[`softmax_attention`][rf_attention.softmax_attention] of ``q`` over the context's ``k, v``."""
        dropout_p = self.attention_dropout if self.training else 0.0
        return softmax_attention(q, k, v, key_padding_mask=context_padding_mask, dropout_p=dropout_p)

    def prefill_heads(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        key_padding_mask: torch.Tensor | None,
        ends: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Any]:
        """Causal attention and a [`KVCache`][rf_attention.decoding.KVCache] holding ``k``, ``v``.

        The cache keeps the positions past ``ends`` as padding (softmax weighs keys whatever their position).
        """
        cache = KVCache.empty(k, v, capacity=max(16, k.shape[-2]))
        return self.attend(q, k, v, key_padding_mask), cache.append(k, v, key_padding_mask)

    def step_heads(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Any
    ) -> tuple[torch.Tensor, Any]:
        """Append ``k, v`` to the cache (a new one for ``state=None``) and attend over it."""
        cache = KVCache.empty(k, v) if state is None else state
        if not isinstance(cache, KVCache):
            raise ValueError(
                f"state: expected a KVCache (from prefill or step) or None, got {type(cache).__name__}"
            )
        cache.append(k, v)
        return cache.attend(q), cache


class RandomFeatureAttention(MultiheadSelfAttention):
    r"""Kernelized attention with a random feature map shared by the heads (Spectraformer, Figure 1), O(N).

    Args:
        component: an ``rf_features`` component name (``"oprf"``, ...).
        weight_matrix: an ``rf_matrices`` weight matrix name (``"fastfoodl"``, ...).
        num_features: rows $s$ of the weight matrix.
        seed: seeds all of the module's randomness but dropout: the weight matrix (and its redraws) and
            the projections' initialization (see
            [`MultiheadSelfAttention`][rf_attention.MultiheadSelfAttention]).
        kernel: ``"softmax"`` (approximates softmax attention) or ``"gaussian"`` (Skyformer-style).
        redraw_interval: redraw the random features before every ``redraw_interval``-th training forward
            pass (calls ``k, 2k, ...`` counting from 0); never in eval; 0 = never. Learned matrices
            (``fastfoodl``, ``learnable=True``) are never redrawn. The module traces whole under
            ``torch.compile`` (``fullgraph=True``) with redraws too: the redraw is one operator of the graph
            (``rf_attention::redraw_features_if_due``) that reads the call count (one host read of a
            scalar per training call) and draws on the host when due.
        matrix_options: extra keyword arguments for the weight matrix (``{"learn_gb": True}``).
        learnable: one trainable weight matrix per head, ``(H, s, Dh)``, initialized by its draws
            (``rf_features.FeatureMap``'s ``learnable`` and ``num_heads``). A positive ``redraw_interval``
            is then refused: a redraw would throw away what was learned.
        input_map: a learned linear map of the queries and one of the keys per head before the features
            (identity at initialization; ``rf_features.FeatureMap``'s ``input_map``).
        window: the sliding-window hybrid (``causal=True``, ``kernel="softmax"``): the last ``window``
            positions are weighed by exact softmax weights, earlier ones by the features, in one normalized
            sum ([`rf_attention.ops.window`][rf_attention.ops.window]; a learned map's by LoLCATs' trained
            per-head factor, its ``window_logit``); decoding then keeps the feature sums and a ring of the
            last ``window`` keys and values. 0: plain random features.
        backend: ``"auto"``, ``"torch"`` or ``"triton"``: the kernels of the forward pass
            ([`rf_attention`][rf_attention.rf_attention]) and of ``step``
            ([`decode`][rf_attention.ops.recurrent.decode]'s ``backend``); ``prefill`` runs on PyTorch.
        **kw: [`MultiheadSelfAttention`][rf_attention.MultiheadSelfAttention] arguments.

    In causal mode the feature map's data-dependent parameters (OPRF's $A$, SADERF's $\Psi$) come from
    running averages over earlier training batches (``statistics_mode="running"``): nothing computed for a
    position depends on later positions. Decoding ([`step`][rf_attention.MultiheadSelfAttention.step])
    keeps the ``m x Dv`` state of [`RecurrentState`][rf_attention.ops.recurrent.RecurrentState]; in ``eval()``
    it gives the causal forward's outputs.
    In training, each call updates the running statistics and may redraw the features, which invalidates
    a state built before.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        component: str,
        weight_matrix: str,
        num_features: int = 128,
        seed: int | None = None,
        kernel: str = "softmax",
        redraw_interval: int = 0,
        matrix_options: dict[str, Any] | None = None,
        learnable: bool = False,
        input_map: bool = False,
        window: int = 0,
        backend: str = "auto",
        **kw: Any,
    ) -> None:
        super().__init__(dim, num_heads, seed=seed, **kw)
        check_backend(backend)
        self.backend = backend
        check_int("redraw_interval", redraw_interval, minimum=0)
        self._checked_window(window)
        if window and kernel != "softmax":
            raise ValueError(f"window: the sliding-window hybrid needs kernel='softmax', got {kernel!r}")
        self.window = window
        if learnable and redraw_interval:
            raise ValueError(
                f"redraw_interval: expected 0 with learnable=True (a redraw would throw away the learned "
                f"matrices), got {redraw_interval}"
            )
        self.feature_map = rf_features.create(
            component,
            weight_matrix=weight_matrix,
            num_features=num_features,
            dim=self.head_dim,
            seed=seed,
            kernel=kernel,
            matrix_options=matrix_options,
            statistics_mode="running" if self.causal else "batch",
            learnable=learnable,
            num_heads=num_heads if learnable else None,
            input_map=input_map,
            **({"window_factor": True} if window and component.lower() in rf_features.LEARNED else {}),
        )
        self.redraw_interval = redraw_interval
        self.training_calls: torch.Tensor
        self.register_buffer("training_calls", torch.zeros((), dtype=torch.long))
        _REDRAWING[id(self)] = self

    def extra_repr(self) -> str:
        """Width, heads, causality and a sliding window (when there is one) shown by ``repr``."""
        return super().extra_repr() + (f", window={self.window}" if self.window else "")

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickling and ``copy.deepcopy``: the copy redraws its own features."""
        super().__setstate__(state)  # type: ignore[no-untyped-call]  # torch leaves it untyped
        _REDRAWING[id(self)] = self

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """[`layer_attention`][rf_attention.modules.layer_attention] with this module's feature map."""
        self._count_training_call()
        return layer_attention(
            self,
            self.feature_map,
            q,
            k,
            v,
            causal=self.causal,
            key_padding_mask=key_padding_mask,
            query_padding_mask=key_padding_mask,
            window=self.window,
            backend=self.backend,
        )

    def attend_cross(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        context_padding_mask: torch.Tensor | None,
        query_padding_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """[`rf_attention`][rf_attention.rf_attention] of ``q (B, H, N, Dh)`` over ``k, v (B, H, M, Dh)``.

        The feature map's batch statistics (OPRF, SADERF) come from the queries and the context's keys,
        padding left out; training calls count towards redraws as in
        [`attend`][rf_attention.RandomFeatureAttention.attend].
        """
        self._count_training_call()
        return rf_attention(
            q,
            k,
            v,
            self.feature_map,
            key_padding_mask=context_padding_mask,
            query_padding_mask=query_padding_mask,
            backend=self.backend,
        )

    def _count_training_call(self) -> None:
        """In training, redraw the features before every ``redraw_interval``-th call, then count this one.

        Tensor operations only (the count is a buffer, the redraw one operator), so that a compiled training
        step has one graph whatever the count.
        """
        if not self.training:
            return
        matrix = self.feature_map.weight_matrix
        if self.redraw_interval and matrix.redrawable:
            redraw_features_if_due(id(self), self.training_calls, list(matrix.buffers()))
        self.training_calls += 1

    def prefill_heads(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        key_padding_mask: torch.Tensor | None,
        ends: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Any]:
        """[`decode_heads`][rf_attention.decoding.decode_heads] from no state."""
        return decode_heads(
            q, k, v, self.feature_map, None, window=self.window, key_padding_mask=key_padding_mask, ends=ends,
            backend=self.backend,
        )  # fmt: skip

    def step_heads(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Any
    ) -> tuple[torch.Tensor, Any]:
        """[`decode_heads`][rf_attention.decoding.decode_heads] of the new positions from ``state``."""
        return decode_heads(q, k, v, self.feature_map, state, window=self.window, backend=self.backend)
