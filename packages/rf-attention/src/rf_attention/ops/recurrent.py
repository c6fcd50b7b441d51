r"""The recurrent form of causal RF attention: the state a prefix leaves, and decoding steps from it.

Causal kernelized attention (Eq. 7 with the sums over $j \le i$) is a recurrence: after $t$ tokens, all
that later queries need is the ``m x (Dv + 1)`` sums $\sum_j \phi_{k_j}^\top [v_j, 1]$ (numerator and
normalizer), kept relative to a log-scale $R$ (the true sums are $e^R$ times the stored ones), and, for
features with signs, $\sum_j |\phi_{k_j}|$ for the normalizer's guard: $O(1)$ memory and time per token.

[`decode`][rf_attention.ops.recurrent.decode] is the one entry point (the modules' ``prefill``/``step``
and the Hugging Face cache call it):

- $T > 1$ new tokens (a prompt), or a feature map without a closed form: the causal kernel,
  [`causal_attention`][rf_attention.ops.causal.causal_attention] (groups of chunks, memory linear in
  ``T``), with the closed form's hand-written VJPs where there is one; it continues the state and returns
  the outputs and the state after the tokens from the same pass;
- $T = 1$ (a decoding step) with a closed form (the map's ``rf_features.FeatureContract``): a fused step. Both
  sides' log-features come from one matmul of $[q, k, k \odot k, R]$ with a projection laid out once per
  state (the query's $g \cdot q \odot q$ is left out: a constant per query row cancels); one softmax over
  the query's log-features and over the key's log-features joined by $R$ gives the query features, the
  new key's weights $e^{\log \phi_k - R'}$ and the old sums' decay $e^{R - R'}$ together, with
  $R' = \operatorname{logsumexp}(\log \phi_k, R) \ge \max(R, \max \log \phi_k)$ (so no weight exceeds 1
  and the normalizer's entries sum to about 1); then the state update, the readout and the guard of
  [`guarded_denominator`][rf_attention.ops.common.guarded_denominator], the kernels' rule;
- $T = 1$ with a closed form on the Triton backend (``backend="triton"``, or ``"auto"`` on CUDA tensors):
  ``rf_attention.ops.triton.fused_recurrent.fused_recurrent_step``, one kernel
  launch for the features, the state update, the readout and the guard of every head of the layer. It
  reads and writes the same ``RecurrentState`` (its log-scale is $\max(R, \max \log \phi_k)$, another
  stabilizer that cancels), so PyTorch and Triton steps continue each other's states.

All are the plain formula $\phi_q \sum_j \phi_{k_j}^\top v_j / \phi_q \sum_j \phi_{k_j}^\top$ with
stabilizers that cancel exactly; in ``eval()`` a step equals the causal forward pass to rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

import rf_features
from rf_attention.functional import _accumulation_dtype, input_scale, window_log_factor
from rf_attention.ops.causal import CausalState, causal_attention
from rf_attention.ops.common import DEFAULT_CHUNK_SIZE, guarded_denominator, with_ones
from rf_attention.ops.features import ClosedForm, Features, feature_strategy
from rf_attention.ops.triton import uses_triton
from rf_attention.ops.window import WindowState, window_prefill, window_step
from spectraformer_core import check_int

if TYPE_CHECKING:  # the Triton backend's module imports triton
    from rf_attention.ops.triton.fused_recurrent import KernelLayout


@dataclass(frozen=True)
class StepLayout:
    """A feature map's closed form laid out for the fused step, built once per state (and map version).

    The step's log-features are ``[q, k, k * k, R] @ projection + offset``, ``(B H, width)``, columns:
    the query's ``m`` log-features and one ``-inf`` (no feature), the key's ``m`` log-features and the
    reference's column; trigonometric features add the same layout of phases (the sines as cosines
    shifted by ``-pi/2``, a negative query sign as ``+pi``; 0 in the two extra columns).

    Attributes:
        projection: ``(3 Dh + 1, width)``.
        offset: ``(width,)``.
        sign: ``(m, 1)`` signs of the query features, or None (none, or folded into the phases).
        trigonometric: the cos/sin form.
        key: the versions of the feature map's tensors (and dtype, input scale) it was built from.
    """

    projection: torch.Tensor
    offset: torch.Tensor
    sign: torch.Tensor | None
    trigonometric: bool
    key: tuple[object, ...]


@dataclass
class RecurrentState:
    r"""Sums over the keys seen so far, relative to the log-scale $R$ (recurrent Eq. 7).

    Attributes:
        sums: ``(..., m, Dv + 1)``: ``[numerator, normalizer]``, ``e^{-R} sum_j phi_k_j^T [v_j, 1]``.
        log_scale: ``(..., 1, 1)``: $R$, at least the largest log-feature of every key seen; the dtype's
            lowest finite value while no (non-padding) key has been seen (finite, so that the fused step's
            matmul never meets ``-inf * 0``).
        magnitude: ``(..., m, 1)``: ``e^{-R} sum_j |phi_k_j|``, the scale of the normalizer's guard, for
            features with signs; None for positive features.
        length: tokens seen, padding included (the position of the next token): an ``int``, or a
            ``(B,)`` integer tensor when the ``B`` sequences have different lengths (a packed prefill,
            ``prefill(..., cu_seqlens=...)``); each new token adds 1 to every entry.
        layout: the feature map laid out for the fused step, ``StepLayout`` (PyTorch) or
            ``rf_attention.ops.triton.fused_recurrent.KernelLayout`` (Triton), built by
            the first step of a backend; not part of ``nbytes`` (it does not depend on the number of
            tokens).
    """

    sums: torch.Tensor
    log_scale: torch.Tensor
    magnitude: torch.Tensor | None = None
    length: int | torch.Tensor = 0
    layout: StepLayout | KernelLayout | None = field(default=None, repr=False, compare=False)

    @classmethod
    def empty(
        cls,
        lead: tuple[int, ...],
        num_features: int,
        value_dim: int,
        *,
        signed: bool,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> RecurrentState:
        """The state before any token, for leading shape ``lead`` (``(B, H)``)."""
        return cls(
            sums=torch.zeros(*lead, num_features, value_dim + 1, dtype=dtype, device=device),
            log_scale=torch.full((*lead, 1, 1), torch.finfo(dtype).min, dtype=dtype, device=device),
            magnitude=torch.zeros(*lead, num_features, 1, dtype=dtype, device=device) if signed else None,
        )

    @property
    def numerator(self) -> torch.Tensor:
        """``(..., m, Dv)``: ``e^{-R} sum_j phi_k_j^T v_j``."""
        return self.sums[..., :-1]

    @property
    def normalizer(self) -> torch.Tensor:
        """``(..., m)``: ``e^{-R} sum_j phi_k_j``."""
        return self.sums[..., -1]

    @property
    def reference(self) -> torch.Tensor:
        """``(...)``: the log-scale $R$."""
        return self.log_scale[..., 0, 0]

    def nbytes(self) -> int:
        """Bytes held by the sums (independent of ``length``)."""
        return sum(t.numel() * t.element_size() for t in self._tensors())

    def check_fits(self, lead: tuple[int, ...], num_features: int, value_dim: int) -> None:
        """A ``ValueError`` unless the state belongs to inputs of leading shape ``lead`` and these widths."""
        expected = (*lead, num_features, value_dim + 1)
        if tuple(self.sums.shape) != expected:
            raise ValueError(
                f"state: expected a RecurrentState of sums shape {expected} (batch, heads, features, "
                f"value dim + 1), got {tuple(self.sums.shape)}"
            )

    def select(self, index: torch.Tensor) -> RecurrentState:
        """The state of batch rows ``index`` (``(B',)`` integers; beam search reorders with it)."""
        index = index.to(self.sums.device)
        length = self.length[index] if isinstance(self.length, torch.Tensor) else self.length
        return RecurrentState(
            sums=self.sums.index_select(0, index),
            log_scale=self.log_scale.index_select(0, index),
            magnitude=None if self.magnitude is None else self.magnitude.index_select(0, index),
            length=length,
            layout=self.layout,
        )

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        rest = () if self.magnitude is None else (self.magnitude,)
        return self.sums, self.log_scale, *rest


def decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    feature_map: rf_features.FeatureMap,
    state: RecurrentState | None,
    *,
    key_padding_mask: torch.Tensor | None = None,
    scale: float | None = None,
    chunk_size: int | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, RecurrentState]:
    r"""Causal RF attention of ``T`` new tokens continuing ``state``, and the state after them (Eq. 7).

    Position $i$ of the new tokens attends to every key of ``state`` and to the new keys $j \le i$,
    exactly as in the causal forward pass over the whole sequence. $T = 1$ is one fused decoding step,
    $O(m D_v)$ whatever the context.

    Args:
        q: ``(B, H, T, Dh)`` queries, unscaled (as ``scaled_dot_product_attention`` takes them).
        k: ``(B, H, T, Dh)`` keys.
        v: ``(B, H, T, Dv)`` values.
        feature_map: an ``rf_features.FeatureMap`` of dimension ``Dh``; with data-dependent statistics
            (OPRF, SADERF) it must use ``statistics_mode="running"`` (nothing may depend on later tokens).
        state: the keys so far, or None (nothing seen: the ``T`` tokens run causally from the start).
        key_padding_mask: bool ``(B, T)``, True at padding (e.g. left padding of prompts): padded keys are
            never attended to, now or later.
        scale: the logit scale of ``q . k`` (default ``Dh ** -0.5``).
        chunk_size: positions per chunk of the causal kernel when ``T > 1`` (default 128).
        backend: the step's kernels, as ``rf_attention(..., backend=)``'s: ``"triton"`` (``"auto"``: on
            CUDA tensors when triton imports) runs a step of a closed-form map as one
            ``rf_attention.ops.triton.fused_recurrent.fused_recurrent_step`` launch;
            ``T > 1`` runs the PyTorch causal kernel on every backend. ``"auto"`` takes PyTorch where
            autograd records the step (the Triton step has no backward), ``"triton"`` refuses it.

    Returns:
        ``(out (B, H, T, Dv) in v's dtype, state)``, the state in the accumulation dtype (float32 for
        float16/bfloat16 inputs).
    """
    _check_inputs(q, k, v, feature_map, state, key_padding_mask)
    acc = _accumulation_dtype(q, k, v) if state is None else state.sums.dtype
    x_scale = input_scale(q.shape[-1], scale)
    step = q.shape[-2] == 1
    triton = uses_triton(backend, q, closed_form=None)  # the device and dtype decide first
    if triton and step and _records_gradient(q, k, v, feature_map, state):
        if backend == "triton":
            raise ValueError(
                "backend: the Triton decoding step has no backward, and autograd records this step; run it "
                "under torch.no_grad() or with backend='auto' or 'torch'"
            )
        triton = False
    kept = _kept_layout(feature_map, state, acc, x_scale) if step and not triton else None
    if state is not None and kept is not None:
        out, new = _step(q, k, v, key_padding_mask, state, kept, acc)
        return out.to(v.dtype), new
    version = _kernel_version(feature_map, acc, x_scale, q) if step and triton else None
    kept_kernel = _kept_kernel_layout(state, version)
    if state is not None and kept_kernel is not None:
        return _triton_step(q, k, v, key_padding_mask, kept_kernel, state)
    qs, ks = q.to(acc), k.to(acc)
    contract = feature_map.contract(
        qs,
        ks,
        scale=x_scale,
        key_padding_mask=key_padding_mask,
        query_padding_mask=key_padding_mask,
        dtype=acc,
    )
    if triton:  # refuses a map without a closed form by name ("auto": PyTorch)
        triton = uses_triton(backend, q, closed_form=None if contract.closed else type(feature_map).__name__)
    if step and state is None:
        lead, m = tuple(q.shape[:2]), contract.width
        state = RecurrentState.empty(lead, m, v.shape[-1], signed=contract.signed, dtype=acc, device=q.device)
    if state is not None and step and triton:
        kernel_layout = _kernel_layout(contract, state, acc, version)
        return _triton_step(q, k, v, key_padding_mask, kernel_layout, state)
    if state is not None and step and contract.closed:
        layout = _step_layout(feature_map, contract, state, acc, x_scale)
        if layout is not None:
            out, new = _step(q, k, v, key_padding_mask, state, layout, acc)
            return out.to(v.dtype), new
    features = feature_strategy(contract, q.shape[:-2], acc)
    mask = None if key_padding_mask is None else key_padding_mask[:, None, :].expand(q.shape[:-1])
    chunk = DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size
    out, new = _prompt(qs, ks, v.to(acc), mask, features, state, contract.width, chunk)
    return out.to(v.dtype), new


def _records_gradient(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    fm: rf_features.FeatureMap,
    state: RecurrentState | None,
) -> bool:
    """Whether autograd records a step: a gradient is on and an input, the state or a parameter needs one."""
    held = () if state is None else state._tensors()
    tensors = (q, k, v, *held, *fm.parameters())
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _kernel_version(
    fm: rf_features.FeatureMap, acc: torch.dtype, x_scale: float, q: torch.Tensor
) -> tuple[object, ...] | None:
    """What a kept `KernelLayout` depends on: `_layout_key` and the batch and heads; None: keep none."""
    key = _layout_key(fm, acc, x_scale)
    return None if key is None else (*key, *q.shape[:2])


def _kept_kernel_layout(
    state: RecurrentState | None, version: tuple[object, ...] | None
) -> KernelLayout | None:
    """The state's Triton layout if it was built from the map as it is now, else None."""
    if state is None or version is None or state.layout is None or isinstance(state.layout, StepLayout):
        return None
    return state.layout if state.layout.version == version else None


def _kernel_layout(
    contract: rf_features.FeatureContract,
    state: RecurrentState,
    acc: torch.dtype,
    version: tuple[object, ...] | None,
) -> KernelLayout:
    """A closed-form contract laid out for the Triton step, kept on ``state`` where it may be.

    Kept for a ``version`` (not None) and forms shared by every batch row and head (as `_step_layout`).
    """
    from rf_attention.ops.triton.fused_recurrent import KernelLayout

    lead = state.sums.shape[:-2]
    layout = KernelLayout.of(ClosedForm.of(contract, lead, acc), math.prod(lead), version or ())
    assert contract.query is not None, "a closed-form contract"
    assert contract.key is not None, "a closed-form contract"
    if version is not None and contract.query.matrix.dim() == 2 and contract.key.matrix.dim() == 2:
        state.layout = layout
    return layout


def _triton_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    layout: KernelLayout,
    state: RecurrentState,
) -> tuple[torch.Tensor, RecurrentState]:
    """One token ``q, k, v (B, H, 1, .)`` by one Triton launch; ``mask`` ``(B, 1)`` True at padding."""
    from rf_attention.ops.triton.fused_recurrent import fused_recurrent_step

    eps = torch.finfo(state.sums.dtype).eps
    out, sums, log_scale, magnitude = fused_recurrent_step(
        q, k, v, mask, layout, state.sums, state.log_scale, state.magnitude, eps
    )
    new = RecurrentState(sums, log_scale, magnitude, length=state.length + 1, layout=state.layout)
    return out, new


def _prompt(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    features: Features,
    state: RecurrentState | None,
    width: int,
    chunk: int,
) -> tuple[torch.Tensor, RecurrentState]:
    """``T`` tokens by the causal kernel continuing ``state``; outputs and state from the same pass."""
    lead, n, acc = tuple(q.shape[:2]), q.shape[-2], v.dtype
    carried = None
    if state is not None:
        magnitude = None if state.magnitude is None else state.magnitude.squeeze(-1)
        carried = CausalState(state.sums, magnitude, state.reference)
    eps = torch.finfo(acc).eps
    out, final = causal_attention(q, k, v, mask, features, width=width, chunk=chunk, eps=eps, state=carried)
    new = RecurrentState(
        sums=final.sums,
        log_scale=final.reference.clamp_min(torch.finfo(acc).min).reshape(*lead, 1, 1),
        magnitude=None if final.magnitude is None else final.magnitude.unsqueeze(-1),
        length=n if state is None else state.length + n,
        layout=None if state is None else state.layout,
    )
    return out, new


def decode_window(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    feature_map: rf_features.FeatureMap,
    state: WindowState | None,
    *,
    window: int,
    key_padding_mask: torch.Tensor | None = None,
    scale: float | None = None,
    chunk_size: int | None = None,
    ends: torch.Tensor | None = None,
) -> tuple[torch.Tensor, WindowState]:
    r"""Hybrid attention of ``T`` new tokens continuing ``state``, and the state after them.

    The [`decode`][rf_attention.ops.recurrent.decode] of the sliding-window hybrid
    ([`rf_attention.ops.window`][rf_attention.ops.window]). From no state, the ``T`` tokens run through
    the hybrid's forward pass and leave a [`WindowState`][rf_attention.ops.window.WindowState] (the feature
    sums of keys older than the window, the ring of the last ``window`` keys and values); from a state,
    each token is one [`window_step`][rf_attention.ops.window.window_step],
    ``O(m (Dh + Dv) + w Dh)`` whatever the context. The state is updated in place.

    Args:
        q: ``(B, H, T, Dh)`` queries, unscaled.
        k: ``(B, H, T, Dh)`` keys.
        v: ``(B, H, T, Dv)`` values.
        feature_map: as for ``decode`` (``kernel="softmax"``).
        state: the tokens so far, or None.
        window: ``w >= 1``, the keys ``(i - w, i]`` weighed exactly (the state's ring, when given).
        key_padding_mask: bool ``(B, T)``, True at padding.
        scale: the logit scale of ``q . k`` (default ``Dh ** -0.5``), of the exact weights and the features.
        chunk_size: positions per chunk of the causal kernel from no state (default 128).
        ends: ``(B,)`` prompt lengths of right-padded packed prompts (from no state only): each row's
            window ends at its own last token.

    Returns:
        ``(out (B, H, T, Dv) in v's dtype, state)``.
    """
    _check_inputs(q, k, v, feature_map, None, key_padding_mask)
    check_int("window", window, minimum=1)
    if state is not None and (not isinstance(state, WindowState) or state.window != window):
        held = f" of window {state.window}" if isinstance(state, WindowState) else ""
        raise ValueError(
            f"state: expected a WindowState of window {window} (from prefill or step) or None, got "
            f"{type(state).__name__}{held}"
        )
    acc = _accumulation_dtype(q, k, v) if state is None else state.sums.dtype
    x_scale = input_scale(q.shape[-1], scale)
    qs, ks, vs = q.to(acc), k.to(acc), v.to(acc)
    contract = feature_map.contract(
        qs,
        ks,
        scale=x_scale,
        key_padding_mask=key_padding_mask,
        query_padding_mask=key_padding_mask,
        dtype=acc,
        closed_form=False,  # the window's loop takes the callable
    )
    features = contract.log_features
    assert features is not None, "asked for the callable"
    eps = torch.finfo(acc).eps
    log_factor = window_log_factor(feature_map, acc)
    if state is None:
        chunk = DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size
        out, state = window_prefill(
            qs, ks, vs, key_padding_mask, features, window=window, scale=x_scale**2, chunk=chunk, eps=eps,
            signed=contract.signed, ends=ends, log_factor=log_factor,
        )  # fmt: skip
        return out.to(v.dtype), state
    outs = []
    for t in range(q.shape[-2]):
        padding = None if key_padding_mask is None else key_padding_mask[:, t]
        new = slice(t, t + 1)
        outs.append(
            window_step(qs[..., new, :], ks[..., new, :], vs[..., new, :], padding, state, features,
                        scale=x_scale**2, eps=eps, log_factor=log_factor)
        )  # fmt: skip
    return torch.cat(outs, dim=-2).to(v.dtype), state


def _step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    state: RecurrentState,
    layout: StepLayout,
    acc: torch.dtype,
) -> tuple[torch.Tensor, RecurrentState]:
    r"""One new token ``q, k, v (B, H, 1, .)`` against ``state``: the fused step of the module docstring.

    ``log phi = [q, k, k*k, R] P + b``; one softmax over ``[log phi_q, -inf]`` and ``[log phi_k, R]`` gives
    ``phi_q`` (times a constant), ``w = e^{log phi_k - R'}`` and ``d = e^{R - R'}``;
    ``S' = d S + w^T [v, 1]`` and ``out = phi_q S'_v / guard(phi_q S'_1)`` (Eq. 7).
    """
    b, h, _, dv = v.shape
    m = state.sums.shape[-2]
    if q.dtype != acc:
        q, k, v = q.to(acc), k.to(acc), v.to(acc)
    inputs = torch.cat((q, k, k * k, state.log_scale), dim=-1)
    logits = torch.addmm(layout.offset, inputs.view(b * h, -1), layout.projection)
    if layout.trigonometric:  # the log-weights' groups, then the phases' groups
        grouped, phases = logits.view(b, h, 2, 2, m + 1, 1).unbind(2)
    else:
        grouped = logits.view(b, h, 2, m + 1, 1)
    log_scale = grouped.logsumexp(dim=3, keepdim=True)[:, :, 1]
    weights = grouped.softmax(dim=3)
    if layout.trigonometric:  # the waves [cos, sin] (1 where the weights are the dummy and the decay)
        weights = weights * phases.cos()
    phi_q, _, phi_k, decay = weights.view(b, h, 2 * m + 2, 1).split((m, 1, m, 1), dim=2)
    if layout.sign is not None:
        phi_q = phi_q * layout.sign
    if mask is not None:
        phi_k = phi_k * (~mask).to(acc).view(b, 1, 1, 1)
    sums = torch.addcmul(state.sums * decay, phi_k, with_ones(v))
    y = (phi_q * sums).sum(dim=2, keepdim=True)
    num, den = y.split((dv, 1), dim=-1)
    magnitude = bound = None
    if state.magnitude is not None:
        magnitude = torch.addcmul(phi_k.abs(), state.magnitude, decay)
        bound = (phi_q.abs() * magnitude).sum(dim=2, keepdim=True)
    den, _ = guarded_denominator(den, bound, torch.finfo(acc).eps)
    new = RecurrentState(sums, log_scale, magnitude, state.length + 1, layout)
    return num / den, new


def _layout_key(fm: rf_features.FeatureMap, acc: torch.dtype, x_scale: float) -> tuple[object, ...] | None:
    """What a kept layout depends on (the map's tensors' versions), or None where none may be kept.

    Nothing is kept in training (the running statistics change with every call) or where autograd records
    through a learned matrix (the layout carries its gradient).
    """
    if fm.training or (torch.is_grad_enabled() and any(p.requires_grad for p in fm.parameters())):
        return None
    return (*((t.data_ptr(), t._version) for t in (*fm.parameters(), *fm.buffers())), acc, x_scale)


def _kept_layout(
    fm: rf_features.FeatureMap, state: RecurrentState | None, acc: torch.dtype, x_scale: float
) -> StepLayout | None:
    """The state's layout if it was built from the map as it is now, else None."""
    key = _layout_key(fm, acc, x_scale)
    layout = None if state is None else state.layout
    return layout if key is not None and isinstance(layout, StepLayout) and layout.key == key else None


def _step_layout(
    fm: rf_features.FeatureMap,
    contract: rf_features.FeatureContract,
    state: RecurrentState,
    acc: torch.dtype,
    x_scale: float,
) -> StepLayout | None:
    """The contract's closed forms laid out for the step, kept on ``state`` where they may be.

    None for forms per batch or head (the step's one projection serves every row).
    """
    query, key_form = contract.query, contract.key
    assert query is not None, "a closed-form contract"
    assert key_form is not None, "a closed-form contract"
    if query.matrix.dim() != 2 or key_form.matrix.dim() != 2:
        return None
    key = _layout_key(fm, acc, x_scale)
    layout = _laid_out(query, key_form, () if key is None else key)
    if key is not None:
        state.layout = layout
    return layout


def _laid_out(
    query: rf_features.ExponentialForm, key: rf_features.ExponentialForm, version: tuple[object, ...]
) -> StepLayout:
    """The projection and offset of `StepLayout` from the two sides' closed forms."""
    a_q, a_k, g_k = query.matrix, key.matrix, key.square_weight
    d, m = a_q.shape[-1], query.offset.shape[-1]
    width = (2 if query.trigonometric else 1) * (2 * m + 2)
    projection = a_q.new_zeros(3 * d + 1, width)
    offset = a_q.new_zeros(width)
    offset[m] = -math.inf
    projection[-1, 2 * m + 1] = 1.0  # R into the reference's column
    projection[2 * d : 3 * d, m + 1 : 2 * m + 1] = g_k.unsqueeze(-1)  # g . (k * k) into every key column
    offset[:m], offset[m + 1 : 2 * m + 1] = query.offset, key.offset
    sign = None if query.sign is None else query.sign.unsqueeze(-1)
    if query.trigonometric:  # phases laid out as the weights; sin = cos(. - pi/2), a negative sign + pi
        half = torch.cat((a_q.new_zeros(m // 2), a_q.new_full((m // 2,), -math.pi / 2)))
        flip = 0.0 if sign is None else (sign.squeeze(-1) < 0) * math.pi
        projection[:d, 2 * m + 2 : 3 * m + 2] = torch.cat((a_q, a_q)).mT
        projection[d : 2 * d, 3 * m + 3 : 4 * m + 3] = torch.cat((a_k, a_k)).mT
        offset[2 * m + 2 : 3 * m + 2] = half + flip
        offset[3 * m + 3 : 4 * m + 3] = half
        sign = None
    else:
        projection[:d, :m] = a_q.mT
        projection[d : 2 * d, m + 1 : 2 * m + 1] = a_k.mT
    return StepLayout(projection, offset, sign, query.trigonometric, version)


def _check_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    fm: rf_features.FeatureMap,
    state: RecurrentState | None,
    mask: torch.Tensor | None,
) -> None:
    """``ValueError`` s naming the argument for shapes, masks, states and maps that cannot decode."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_floating_point():
            raise ValueError(
                f"{name}: expected a floating-point tensor (B, H, T, D), got {getattr(x, 'dtype', type(x))} "
                f"of shape {tuple(getattr(x, 'shape', ()))}"
            )
    if q.shape != k.shape or k.shape[:-1] != v.shape[:-1]:
        raise ValueError(
            "q, k, v: expected shapes (B, H, T, Dh), (B, H, T, Dh), (B, H, T, Dv), got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if mask is not None and (mask.dtype != torch.bool or tuple(mask.shape) != (q.shape[0], q.shape[2])):
        raise ValueError(
            f"key_padding_mask: expected a bool tensor of shape (B, T) = {(q.shape[0], q.shape[2])}, got "
            f"{mask.dtype} {tuple(mask.shape)}"
        )
    if fm.statistics_mode == "batch" and fm.running_statistics_defaults():
        raise ValueError(
            f"feature_map: {type(fm).__name__} computes statistics over the whole sequence, which would let "
            "a position see later ones; create it with statistics_mode='running' for decoding"
        )
    if state is None:
        return
    if not isinstance(state, RecurrentState):
        raise ValueError(f"state: expected a RecurrentState or None, got {type(state).__name__}")
    state.check_fits(tuple(q.shape[:2]), fm.feature_width, v.shape[-1])
