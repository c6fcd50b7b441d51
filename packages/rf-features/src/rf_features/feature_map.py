"""The `FeatureMap` interface: ``phi(q) @ phi(k).mT`` estimates the softmax kernel (Eq. 11)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import rf_matrices
from rf_matrices import WeightMatrix

KERNELS = ("softmax", "gaussian")
STATISTICS_MODES = ("batch", "running")

#: Input dtypes whose features are computed in float32 (and returned in the input dtype).
_LOW_PRECISION = (torch.float16, torch.bfloat16)


#: What a component's [`log_form`][rf_features.FeatureMap.log_form] returns: the matrix ``A`` ``(..., r, d)``,
#: the coefficient of ``||t||^2`` (a float or ``(...)``), the per-column offset (a float or ``(..., m)``) and
#: whether the features are trigonometric.
LogForm = tuple[torch.Tensor, "torch.Tensor | float", "torch.Tensor | float", bool]


@dataclass(frozen=True)
class ExponentialForm:
    r"""The features of ``x (..., n, d)`` in closed form, for kernels that apply them without autograd.

    Positive features: $\phi(x) = \operatorname{sign} \cdot \exp(x A^\top + (x \odot x)\, g + c)$
    (``r = m``). Trigonometric features: $\phi(x) = \operatorname{sign} \cdot \exp((x \odot x)\, g + c)
    \odot [\cos(x A^\top), \sin(x A^\top)]$ (``r = m / 2``). Every component of Section 3.2 is of this form
    (Eq. 18-23: the log-features are affine in $\omega^\top x$ and $\lVert x \rVert^2$), with SADERF's
    $\Psi$, the input scale and the Gaussian kernel's factor folded into ``A`` and ``g`` and the component
    weights into ``c`` and the sign: the exact features.

    Attributes:
        matrix: ``A``, ``(..., r, d)`` (leading dims broadcast against the inputs'; carries the weight
            matrix's gradient when it is learned).
        square_weight: ``g``, ``(..., d)``.
        offset: ``c``, ``(..., m)``.
        sign: ``(m,)`` signs of the component weights (queries only), or None.
        trigonometric: the cos/sin form (the cos and the sin of a row share their offset and sign).
    """

    matrix: torch.Tensor
    square_weight: torch.Tensor
    offset: torch.Tensor
    sign: torch.Tensor | None
    trigonometric: bool


#: ``log_features(x, is_query) -> (log_features, multiplier)`` of ``x (..., n, d)``: the features are
#: ``multiplier * exp(log_features)`` ``(..., n, m)`` (the log part may be ``(..., n, 1)``; the multiplier
#: is None for positive features).
LogFeatures = Callable[[torch.Tensor, bool], tuple[torch.Tensor, "torch.Tensor | None"]]


@dataclass(frozen=True)
class FeatureContract:
    """What attention needs from a feature map for one call: the closed form per side, or a callable.

    Given by [`FeatureMap.contract`][rf_features.FeatureMap.contract], with the call's statistics and input
    scale folded in. Exactly one of the two strategies: ``query`` and ``key`` (every component of Section
    3.2), or ``log_features`` (a map with no closed form: learned maps, ``input_map=True``, a component
    without [`log_form`][rf_features.FeatureMap.log_form]). Both give the exact features, component
    weights included; stabilization is the caller's.

    Attributes:
        width: ``m``, the number of features per input row.
        signed: whether features can be negative (waves, negative quadrature weights, maps not marked
            positive): the normalizer of attention then needs its guard.
        query: the queries' closed form, or None.
        key: the keys' closed form (no sign), or None.
        log_features: ``LogFeatures`` of inputs with the call's leading shape, or None.
    """

    width: int
    signed: bool
    query: ExponentialForm | None = None
    key: ExponentialForm | None = None
    log_features: LogFeatures | None = None

    def __post_init__(self) -> None:
        closed = self.query is not None and self.key is not None
        if closed == (self.log_features is not None) or (self.query is None) != (self.key is None):
            raise ValueError(
                "FeatureContract: expected either both closed forms (query, key) or log_features, got "
                f"query={self.query is not None}, key={self.key is not None}, "
                f"log_features={self.log_features is not None}"
            )

    @property
    def closed(self) -> bool:
        """Whether the features come in closed form."""
        return self.query is not None


class FeatureMap(nn.Module):
    r"""A random feature map $\phi$ built from a component function $f$ and a weight matrix $W$.

    ``forward(q, k)`` returns ``(phi_q, phi_k)`` with ``phi_q @ phi_k.mT`` an unbiased estimate (for Monte
    Carlo matrices) of the softmax kernel $\exp(q_i^\top k_j)$ (``kernel="softmax"``) or of the Gaussian
    kernel $\exp(-\lVert q_i - k_j \rVert^2 / 2)$ (``kernel="gaussian"``), with no hidden rescaling.
    Following Eq. 11, the $l$ components of each row $\omega_i$ are laid out as
    $[f_1(\omega_{1..s}), \dots, f_l(\omega_{1..s})]$, and the row's component weight $a_i$ ($1/s$, or the
    matrix's quadrature weight, possibly negative) enters as $\operatorname{sign}(a_i) \sqrt{|a_i|}$
    on the query side and $\sqrt{|a_i|}$ on the key side.

    Subclasses implement [`log_features`][rf_features.FeatureMap.log_features] for the softmax kernel and may
    give [`statistics`][rf_features.FeatureMap.statistics] (data-dependent parameters such as OPRF's
    ``A``), [`input_scale`][rf_features.FeatureMap.input_scale] (SADERF's ``Psi``) and
    [`log_form`][rf_features.FeatureMap.log_form] (the closed form). Attention asks a map for one
    [`contract`][rf_features.FeatureMap.contract] per call and uses nothing else.

    Args:
        dim: ``d``, the query/key dimension.
        weight_matrix: a registered ``rf_matrices`` name or a [`WeightMatrix`][rf_matrices.WeightMatrix] of
            unit bandwidth (``sigma=1``: the kernels here have unit bandwidth; scale the inputs instead).
        num_features: ``s``, rows of the weight matrix (the feature width ``feature_width`` is
            ``features_per_row * s``).
        seed: seed of the weight matrix.
        kernel: ``"softmax"`` or ``"gaussian"``.
        matrix_options: extra keyword arguments for ``rf_matrices.create`` (e.g. ``{"learn_gb": True}``).
        statistics_mode: ``"batch"``: data-dependent parameters (OPRF's ``A``, SADERF's ``Psi``) come from
            the queries and keys of the call; ``"running"``: from running averages of earlier training calls
            (momentum ``momentum``, updated after use, frozen in eval and while `statistics_frozen`), so
            that nothing computed for a position depends on later positions (causal attention).
        momentum: weight of the newest call in the running averages.
        learnable: the weight matrix is one trainable dense parameter initialized by its draw (see
            [`rf_matrices.DrawnMatrix`][rf_matrices.DrawnMatrix]; never redrawn).
        num_heads: ``H`` independent weight matrices (and input maps, and running statistics), one per head,
            for inputs ``(B, H, n, d)``; None: one shared by every leading index.
        input_map: learn a linear map of the queries and one of the keys, applied before the features
            (``q M_q^T``, ``k M_k^T``, ``(d, d)`` or ``(H, d, d)`` per head, identity at initialization, as
            the learned feature maps of Hedgehog and LoLCATs): the kernel estimated becomes
            ``exp((M_q q) . (M_k k))``. Such a map has no closed form
            (its [`contract`][rf_features.FeatureMap.contract] gives the ``log_features`` callable).

    Running statistics and checkpointing: a forward pass recomputed by ``torch.utils.checkpoint`` (Hugging
    Face's ``gradient_checkpointing``) inside the backward pass reuses the statistics of the forward pass it
    repeats and updates nothing, so a checkpointed step updates them once and its gradients are those of the
    plain step. Set ``statistics_frozen = True`` to keep them fixed in training too (fine-tuning that saves
    only some parameters, e.g. LoRA adapters).

    Running statistics and ``torch.compile``: a training step uses the copy of the running statistics that
    the operator updating them returns (``rf_features.feature_map.update_running_statistic``), so a compiled
    backward graph reads the statistics its forward pass used, not the updated buffers.
    """

    #: Output columns per weight-matrix row (2 for cos/sin pairs and antithetic pairs).
    features_per_row: int = 1
    #: True when every feature is positive (so are the kernel estimates, given non-negative row weights).
    positive: bool = False
    #: True when the estimate of a row is the same for omega and -omega (TrigRF's cos, PosRF-Hyp's cosh).
    even_in_omega: bool = False

    def __init__(
        self,
        dim: int,
        *,
        weight_matrix: str | WeightMatrix = "orf",
        num_features: int = 128,
        seed: int | None = None,
        kernel: str = "softmax",
        matrix_options: dict[str, Any] | None = None,
        statistics_mode: str = "batch",
        momentum: float = 0.1,
        learnable: bool = False,
        num_heads: int | None = None,
        input_map: bool = False,
    ) -> None:
        super().__init__()
        if statistics_mode not in STATISTICS_MODES:
            raise ValueError(f"statistics_mode: expected one of {STATISTICS_MODES}, got {statistics_mode!r}")
        self.statistics_mode, self.momentum = statistics_mode, momentum
        if kernel not in KERNELS:
            raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")
        self.kernel = kernel
        if isinstance(weight_matrix, WeightMatrix):
            if learnable or num_heads is not None:
                raise ValueError(
                    "learnable, num_heads: given with a WeightMatrix instance; pass a registered name (or "
                    "build the matrix with rf_matrices.create(..., learnable=True, num_heads=H))"
                )
            if weight_matrix.dim != dim:
                raise ValueError(
                    f"weight_matrix: expected dim {dim}, got a matrix of dim {weight_matrix.dim}"
                )
            if weight_matrix.sigma != 1.0:
                raise ValueError(
                    "weight_matrix: expected sigma=1 (the kernels have unit bandwidth), "
                    f"got sigma={weight_matrix.sigma}"
                )
            self.weight_matrix = weight_matrix
        else:
            self.weight_matrix = rf_matrices.create(
                weight_matrix,
                num_features,
                dim,
                seed=seed,
                even_in_omega=self.even_in_omega,
                learnable=learnable,
                num_heads=num_heads,
                **(matrix_options or {}),
            )
        if self.positive and self.weight_matrix.signed_weights:
            warnings.warn(
                f"weight_matrix: {self.weight_matrix!r} has quadrature weights that can be negative, so "
                f"the estimates of the positive component {type(self).__name__} (and attention "
                "normalizers) can be zero or negative; sgq's default rule='stiefel' keeps them positive",
                stacklevel=3,
            )
        self.dim = self.weight_matrix.dim
        self.num_heads: int | None = getattr(self.weight_matrix, "num_heads", None)
        defaults = self.running_statistics_defaults()
        self._running_names = tuple(defaults)
        for name, value in defaults.items():
            if self.num_heads is not None:
                value = value.expand(self.num_heads, *value.shape).clone()
            self.register_buffer(f"running_{name}", value.to(torch.get_default_dtype()))
        #: Keep the running statistics fixed in training too.
        self.statistics_frozen = False
        #: The running statistics the last forward pass used (reused by its recomputation in a backward pass).
        self._statistics_in_use: dict[str, torch.Tensor] | None = None
        self.query_map: nn.Parameter | None = None
        self.key_map: nn.Parameter | None = None
        if input_map:
            heads = () if self.num_heads is None else (self.num_heads,)
            eye = torch.eye(self.dim).expand(*heads, self.dim, self.dim)
            self.query_map, self.key_map = nn.Parameter(eye.clone()), nn.Parameter(eye.clone())

    @property
    def num_features(self) -> int:
        """``s``, the rows of the weight matrix ``W``."""
        return self.weight_matrix.num_features

    @property
    def feature_width(self) -> int:
        """``m = features_per_row * s``, the width of ``phi_q`` and ``phi_k`` (``2 s`` for TrigRF)."""
        return self.features_per_row * self.weight_matrix.num_features

    def redraw(self, seed: int | None = None) -> None:
        """Redraw the weight matrix (a no-op for learned ones)."""
        self.weight_matrix.redraw(seed)

    def map_input(self, x: torch.Tensor, *, is_query: bool) -> torch.Tensor:
        """``x (..., n, d)`` through the learned input map of its side (``x M^T``), or ``x`` without one."""
        weight = self.query_map if is_query else self.key_map
        return x if weight is None else x @ weight.to(x.dtype).mT

    def statistics(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        query_mask: torch.Tensor | None,
        key_mask: torch.Tensor | None,
    ) -> dict[str, torch.Tensor]:
        """Data-dependent parameters, per leading index (batch, head), computed without gradient.

        Args:
            q: ``(..., n_q, d)``.
            k: ``(..., n_k, d)``.
            query_mask: ``(..., n_q)`` bool, True for padded queries (left out of every statistic), or None.
            key_mask: ``(..., n_k)`` bool, True for padded keys, or None.

        Returns:
            Named tensors with leading shape ``q.shape[:-2]``; none for data-independent maps.
        """
        return {}

    def running_statistics_defaults(self) -> dict[str, torch.Tensor]:
        """Initial values (and shapes) of the running averages of `statistics`; none by default.

        Each statistic is averaged over its leading (batch, head) dimensions into this shape.
        """
        return {}

    def log_features(
        self, projection: torch.Tensor, sqnorm: torch.Tensor, stats: dict[str, torch.Tensor], is_query: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The component function's features for the softmax kernel, before component weights.

        Args:
            projection: ``x @ W.T``, ``(..., n, s)``.
            sqnorm: ``||x||^2``, ``(..., n, 1)``.
            stats: the output of [`statistics`][rf_features.FeatureMap.statistics].
            is_query: True for ``f^(1)`` (queries), False for ``f^(2)`` (keys).

        Returns:
            ``(log_magnitude, multiplier)``, ``(..., n, features_per_row * s)`` (the log-magnitude may be
            ``(..., n, 1)`` when it is the same for every feature of a row): the features are
            ``multiplier * exp(log_magnitude)``; ``multiplier`` is None for positive features.
        """
        raise NotImplementedError

    def log_form(
        self, matrix: torch.Tensor, stats: dict[str, torch.Tensor], is_query: bool
    ) -> LogForm | None:
        """`log_features` as an affine function of the projection and ``||t||^2``, or None if it is not one.

        Returns ``(A, beta, offset, trigonometric)`` such that `log_features` of ``t`` is
        ``t @ A.mT + beta ||t||^2 + offset`` (positive features) or ``beta ||t||^2 + offset`` with the
        multiplier ``[cos(t @ A.mT), sin(t @ A.mT)]`` (trigonometric). ``matrix`` is ``W`` ``(s, d)``. The
        default, None, leaves a component to the generic path (autograd through `log_features`).
        """
        return None

    def input_scale(self, stats: dict[str, torch.Tensor], is_query: bool) -> torch.Tensor | None:
        """A diagonal map of the inputs before the component function, keeping ``q @ k.mT``, or None.

        ``(..., d)``: queries become ``q * scale_q``, keys ``k * scale_k`` (SADERF's ``Psi`` and
        ``Psi^-1``); None (the default): the inputs as they are.
        """
        return None

    def contract(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        *,
        scale: float = 1.0,
        key_padding_mask: torch.Tensor | None = None,
        query_padding_mask: torch.Tensor | None = None,
        dtype: torch.dtype | None = None,
        closed_form: bool = True,
    ) -> FeatureContract:
        """What attention needs to compute the features of ``q * scale`` and ``k * scale``, for one call.

        The statistics come from the whole of ``q`` and ``k`` (``"batch"`` mode) or the running averages
        (``"running"`` mode; updated here, once, in training). The contract then gives the features of any
        part of ``q`` or ``k`` (chunked attention) with these statistics: by the closed form of each side
        (every component of Section 3.2 without ``input_map``), else by its ``log_features`` callable.
        A weight matrix with learned entries is built once here (its gradient reaches the entries through
        one graph, not one per chunk), except where it applies its fast transform.

        Args:
            q: ``(..., n_q, d)``.
            k: ``(..., n_k, d)`` with the same leading shape.
            scale: factor of ``q`` and ``k`` before the features (attention's ``Dh ** -1/4``).
            key_padding_mask: bool ``(B, n_k)``, True at padding (left out of the statistics).
            query_padding_mask: bool ``(B, n_q)``, True at padding (left out of the statistics).
            dtype: the dtype of the statistics and the closed form (default: ``q``'s, float32 for
                float16/bfloat16).
            closed_form: False gives the ``log_features`` callable even where a closed form exists.

        Returns:
            A [`FeatureContract`][rf_features.FeatureContract] of width ``feature_width``.
        """
        self._check_inputs(q, k)
        key_mask = _broadcast_mask("key_padding_mask", key_padding_mask, k)
        query_mask = _broadcast_mask("query_padding_mask", query_padding_mask, q)
        if dtype is None:
            dtype = torch.float32 if q.dtype in _LOW_PRECISION else q.dtype
        stats = self._current_statistics(q.to(dtype) * scale, k.to(dtype) * scale, query_mask, key_mask)
        wm = self.weight_matrix
        learned = torch.is_grad_enabled() and any(p.requires_grad for p in wm.parameters())
        matrix = wm.matrix() if learned and not getattr(wm, "fast_transform", False) else None
        signed = not self.positive or wm.component_weights is not None
        width = self.feature_width
        if closed_form:
            forms = [self._exponential_form(stats, s, dtype, scale, matrix) for s in (True, False)]
            if forms[0] is not None and forms[1] is not None:
                return FeatureContract(width, signed, query=forms[0], key=forms[1])

        def log_features(x: torch.Tensor, is_query: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
            return self._weighted_log_features(x * scale, stats, is_query, matrix)

        return FeatureContract(width, signed, log_features=log_features)

    def _exponential_form(
        self,
        stats: dict[str, torch.Tensor],
        is_query: bool,
        dtype: torch.dtype,
        scale: float,
        matrix: torch.Tensor | None,
    ) -> ExponentialForm | None:
        """`_weighted_log_features` of ``x * scale`` in closed form, or None (no `log_form`, an input map)."""
        if self.query_map is not None:  # ||M x||^2 is no diagonal form of x
            return None
        if matrix is None:
            wm = self.weight_matrix
            w = wm.cached("matrix", dtype, lambda: wm.matrix().to(dtype))
        else:
            w = matrix.to(dtype)
            stats = {**stats, "matrix": w}
        form = self.log_form(w, stats, is_query)
        if form is None:
            return None
        a, beta, offset, trigonometric = form
        x_scale = self.input_scale(stats, is_query)
        x_scale = w.new_full((self.dim,), scale) if x_scale is None else x_scale * scale
        if isinstance(beta, torch.Tensor):
            beta = beta.unsqueeze(-1)
        square_weight = beta * x_scale.pow(2)
        if self.kernel == "gaussian":
            square_weight = square_weight - scale**2 / 2
        log_weight, sign = self._component_weights(dtype, w.device)
        offset = offset + log_weight
        if not isinstance(offset, torch.Tensor):
            offset = w.new_full((self.feature_width,), offset)
        return ExponentialForm(
            matrix=a * x_scale.unsqueeze(-2),
            square_weight=square_weight,
            offset=offset,
            sign=sign if is_query else None,
            trigonometric=trigonometric,
        )

    def omega_sqnorm(self, dtype: torch.dtype, stats: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """``||omega_i||^2`` of the weight matrix rows, ``(s,)``.

        From ``stats["matrix"]`` when the call built the dense ``W`` (a learned matrix, with its gradient),
        else the weight matrix's (kept between calls).
        """
        if stats is not None and "matrix" in stats:
            return stats["matrix"].to(dtype).pow(2).sum(-1)
        return self.weight_matrix.row_sqnorms(dtype)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        *,
        key_padding_mask: torch.Tensor | None = None,
        query_padding_mask: torch.Tensor | None = None,
        stabilize: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Features ``(phi_q, phi_k)`` of queries and keys.

        Args:
            q: ``(..., n_q, d)``, e.g. ``(B, H, N, d)`` or ``(B, N, d)``.
            k: ``(..., n_k, d)`` with the same leading shape.
            key_padding_mask: bool ``(B, n_k)``, True where the key is padding: padded keys take no part
                in any statistic or stabilizer, and their features are zero.
            query_padding_mask: bool ``(B, n_q)``, True where the query is padding: left out of the
                statistics (for self-attention pass the same mask as ``key_padding_mask``).
            stabilize: rescale each row of ``phi_q`` by its own positive constant and all of ``phi_k``
                (per leading index) by one positive constant, the largest feature becoming 1. The factors
                cancel in normalized attention; ``phi_q @ phi_k.mT`` is then the kernel times them.

        Returns:
            ``phi_q (..., n_q, m)`` and ``phi_k (..., n_k, m)`` in the input dtype, ``m = feature_width``.
        """
        out_dtype = q.dtype
        log_q, mult_q, log_k, mult_k, key_mask = self._log_features_pair(
            q, k, key_padding_mask, query_padding_mask
        )
        if stabilize:
            log_q = log_q - log_q.amax(dim=-1, keepdim=True).detach()
            log_k = log_k - _masked_global_max(log_k, key_mask).detach()
        phi_q, phi_k = _exp_features(log_q, mult_q), _exp_features(log_k, mult_k)
        if key_mask is not None:
            phi_k = phi_k.masked_fill(key_mask.unsqueeze(-1), 0.0)
        return phi_q.to(out_dtype), phi_k.to(out_dtype)

    def forward_with_key_scales(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        *,
        key_padding_mask: torch.Tensor | None = None,
        query_padding_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Stabilized features with the keys' scales kept apart, for causal attention.

        Each query row is rescaled by its own constant (as ``stabilize=True``); each key row ``j`` is
        divided by its own ``exp(c_j)``, ``c_j`` its largest log-feature, and ``c_j`` is returned, so that
        ``phi_q @ (phi_k * exp(c)).mT`` is the (row-rescaled) kernel estimate. Causal attention then applies
        one constant per query position computed from past keys only (``rf_attention.linear_attention``'s
        ``key_log_scale``), where a global key maximum would look at the future.

        Returns:
            ``phi_q (..., n_q, m)``, ``phi_k (..., n_k, m)`` (largest entry of each row 1; padded rows 0)
            and ``key_log_scale (..., n_k)`` (float32 or wider; ``-inf`` for padded keys).
        """
        out_dtype = q.dtype
        log_q, mult_q, log_k, mult_k, key_mask = self._log_features_pair(
            q, k, key_padding_mask, query_padding_mask
        )
        log_q = log_q - log_q.amax(dim=-1, keepdim=True).detach()
        scale = log_k.amax(dim=-1, keepdim=True).detach()
        phi_q, phi_k = _exp_features(log_q, mult_q), _exp_features(log_k - scale, mult_k)
        scale = scale.squeeze(-1)
        if key_mask is not None:
            phi_k = phi_k.masked_fill(key_mask.unsqueeze(-1), 0.0)
            scale = scale.masked_fill(key_mask, -math.inf)
        return phi_q.to(out_dtype), phi_k.to(out_dtype), scale

    def _log_features_pair(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        key_padding_mask: torch.Tensor | None,
        query_padding_mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Weighted log-features and multipliers of queries and keys, and the broadcast key mask."""
        self._check_inputs(q, k)
        key_mask = _broadcast_mask("key_padding_mask", key_padding_mask, k)
        query_mask = _broadcast_mask("query_padding_mask", query_padding_mask, q)
        work = torch.float32 if q.dtype in _LOW_PRECISION else q.dtype
        q, k = q.to(work), k.to(work)
        stats = self._current_statistics(q, k, query_mask, key_mask)
        log_q, mult_q = self._weighted_log_features(q, stats, True, None)
        log_k, mult_k = self._weighted_log_features(k, stats, False, None)
        return log_q, mult_q, log_k, mult_k, key_mask

    def _weighted_log_features(
        self, x: torch.Tensor, stats: dict[str, torch.Tensor], is_query: bool, matrix: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-features and multiplier of queries or keys ``x (..., n, d)``, component weights in (Eq. 11).

        The features are ``multiplier * exp(log_features)``, ``(..., n, m)`` (the log part may be
        ``(..., n, 1)``); ``multiplier`` is None for positive features. ``matrix``: the weight matrix's
        dense ``W`` ``(s, d)`` built once per call, or None.
        """
        x = self.map_input(x, is_query=is_query)
        x_scale = self.input_scale(stats, is_query)
        t = x if x_scale is None else x * x_scale.unsqueeze(-2)
        if matrix is None:
            projection = self.weight_matrix(t)
        else:
            matrix = matrix.to(t.dtype)
            projection = t @ matrix.mT
            # omega_sqnorm derives the row norms from it, only for the components that need them
            stats = {**stats, "matrix": matrix}
        log_x, mult_x = self.log_features(projection, t.pow(2).sum(-1, keepdim=True), stats, is_query)
        log_weight, sign = self._component_weights(x.dtype, x.device)
        log_x = log_x + log_weight
        if sign is not None and is_query:
            mult_x = sign if mult_x is None else mult_x * sign
        if self.kernel == "gaussian":
            # exp(-||q - k||^2 / 2) = exp(q . k) exp(-||q||^2 / 2) exp(-||k||^2 / 2)
            log_x = log_x - x.pow(2).sum(-1, keepdim=True) / 2
        return log_x, mult_x

    def _current_statistics(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        query_mask: torch.Tensor | None,
        key_mask: torch.Tensor | None,
    ) -> dict[str, torch.Tensor]:
        """This call's statistics, or the running ones (then updated after use, in training).

        Of the mapped inputs ([`map_input`][rf_features.FeatureMap.map_input]). In a backward pass (a
        checkpointed forward recomputed) the running ones are those the last forward pass used, not updated.
        """
        with torch.no_grad():
            q, k = self.map_input(q, is_query=True), self.map_input(k, is_query=False)
            if self.statistics_mode == "batch":
                return self.statistics(q, k, query_mask, key_mask)
            in_use = self._statistics_in_use if in_backward_pass() else None
            if in_use is not None:
                running = in_use
            else:
                buffers = {name: getattr(self, f"running_{name}") for name in self._running_names}
                if self.training and buffers and not self.statistics_frozen:
                    running = {}
                    for name, value in self.statistics(q, k, query_mask, key_mask).items():
                        buffer = buffers[name]
                        mean = value.reshape(-1, *buffer.shape).mean(0).to(buffer)
                        running[name] = update_running_statistic(buffer, mean, self.momentum)
                else:
                    running = {name: buffer.clone() for name, buffer in buffers.items()}
                if not torch.compiler.is_compiling():
                    self._statistics_in_use = running
            return {name: value.to(q.dtype) for name, value in running.items()}

    def _component_weights(
        self, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor | float, torch.Tensor | None]:
        """``0.5 log|a_i|`` and ``sign(a_i)``, ``(m,)`` in the Eq. 11 column layout.

        For Monte Carlo matrices every ``a_i = 1/s``: a float, and no sign.
        """
        a = self.weight_matrix.component_weights
        if a is None:
            return -0.5 * math.log(self.weight_matrix.num_features), None
        a = a.to(dtype=dtype, device=device)
        log_weight, sign = 0.5 * a.abs().log(), torch.sign(a)
        return log_weight.repeat(self.features_per_row), sign.repeat(self.features_per_row)

    def _check_inputs(self, q: torch.Tensor, k: torch.Tensor) -> None:
        for name, x in (("q", q), ("k", k)):
            if not isinstance(x, torch.Tensor) or not x.is_floating_point():
                raise ValueError(
                    f"{name}: expected a floating-point tensor (..., n, {self.dim}), got {x!r:.60}"
                )
            if x.dim() < 2 or x.shape[-1] != self.dim:
                raise ValueError(f"{name}: expected shape (..., n, {self.dim}), got {tuple(x.shape)}")
            if self.num_heads is not None and (x.dim() < 3 or x.shape[-3] != self.num_heads):
                raise ValueError(
                    f"{name}: expected shape (..., {self.num_heads}, n, {self.dim}) (one map per head, "
                    f"num_heads={self.num_heads}), got {tuple(x.shape)}"
                )
        if q.shape[:-2] != k.shape[:-2]:
            raise ValueError(
                "q, k: expected the same leading (batch, head) shape, "
                f"got {tuple(q.shape)} and {tuple(k.shape)}"
            )

    def extra_repr(self) -> str:
        """The kernel and the output width shown by ``repr``."""
        return f"kernel={self.kernel!r}, num_features={self.num_features}, feature_width={self.feature_width}"


@torch.library.custom_op("rf_features::update_running_statistic", mutates_args=("running",))
def update_running_statistic(running: torch.Tensor, value: torch.Tensor, momentum: float) -> torch.Tensor:
    """Move ``running`` towards ``value`` by ``momentum`` (in place) and return a copy of it from before.

    One operator, opaque to ``torch.compile``, whose output is the copy the step uses: AOT autograd's
    partitioner may recompute a cheap copy of a buffer (``clone``) in the backward graph from the buffer
    itself, which the compiled step has updated by then; it saves the output of an opaque operator instead.
    """
    before = running.clone()
    running.lerp_(value, momentum)
    return before


@update_running_statistic.register_fake
def _update_running_statistic_fake(
    running: torch.Tensor, value: torch.Tensor, momentum: float
) -> torch.Tensor:
    return torch.empty_like(running)


def in_backward_pass() -> bool:
    """True while autograd runs a backward pass, where ``torch.utils.checkpoint`` recomputes a forward.

    Reentrant or not, checkpointing recomputes inside the autograd engine's graph task (whose id is -1
    outside one; PyTorch exposes it only as ``torch._C._current_graph_task_id``). False under
    ``torch.compile``, whose compiled graphs recompute without running the module's Python again.
    """
    if torch.compiler.is_compiling():
        return False
    return torch._C._current_graph_task_id() != -1


def _exp_features(log_features: torch.Tensor, multiplier: torch.Tensor | None) -> torch.Tensor:
    features = torch.exp(log_features)
    return features if multiplier is None else features * multiplier


def _broadcast_mask(name: str, mask: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
    """A ``(B, n)`` padding mask broadcast to ``x.shape[:-1]`` (``(B, n)`` or ``(B, H, n)``)."""
    if mask is None:
        return None
    if mask.dtype != torch.bool or mask.dim() != 2 or mask.shape != (x.shape[0], x.shape[-2]) or x.dim() > 4:
        raise ValueError(
            f"{name}: expected a bool tensor of shape (B, n) = {(x.shape[0], x.shape[-2])} for inputs "
            f"(B, n, d) or (B, H, n, d), got {mask.dtype} {tuple(mask.shape)} for inputs {tuple(x.shape)}"
        )
    mask = mask.to(x.device)
    return mask[:, None, :].expand(*x.shape[:-1]) if x.dim() == 4 else mask


def _masked_global_max(log_k: torch.Tensor, key_mask: torch.Tensor | None) -> torch.Tensor:
    """Max of ``log_k (..., n, m)`` over its last two dims, padded keys left out; 0 where all are padded."""
    if key_mask is not None:
        log_k = log_k.masked_fill(key_mask.unsqueeze(-1), -math.inf)
    top = log_k.amax(dim=(-2, -1), keepdim=True)
    return torch.where(torch.isfinite(top), top, torch.zeros_like(top))


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None, dim: int = -2) -> torch.Tensor:
    """Mean of ``x (..., n, c)`` over ``n`` leaving out rows where ``mask (..., n)`` is True."""
    if mask is None:
        return x.mean(dim=dim)
    keep = (~mask).unsqueeze(-1).to(x.dtype)
    return (x * keep).sum(dim=dim) / keep.sum(dim=dim).clamp_min(1.0)
