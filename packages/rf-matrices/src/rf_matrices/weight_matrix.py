"""The `WeightMatrix` interface shared by every weight matrix (Definition 3.1 of the paper)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from spectraformer_core import check_positive_int, make_generator


def chi_samples(count: int, dof: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` float64 draws from the chi(``dof``) distribution, as norms of Gaussian vectors."""
    g = torch.randn(count, dof, generator=generator, dtype=torch.float64, device=generator.device)
    norms: torch.Tensor = g.norm(dim=-1)
    return norms


def haar_orthogonal(count: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` independent Haar-distributed orthogonal matrices ``(count, dim, dim)`` in float64.

    QR of a Gaussian matrix with the signs of R's diagonal moved into Q (Mezzadri 2007): without the sign
    fix, Q is not uniformly distributed.
    """
    g = torch.randn(count, dim, dim, generator=generator, dtype=torch.float64, device=generator.device)
    q, r = torch.linalg.qr(g)
    signs = torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    return q * signs


class WeightMatrix(nn.Module):
    """A weight matrix ``W`` of shape ``(s, d)`` whose rows stand in for frequencies omega ~ p.

    Rows are draws for (or quadrature nodes of) the Gaussian ``N(0, I / sigma^2)``, the spectral density of
    the RBF kernel ``exp(-||x - y||^2 / (2 sigma^2))``, so ``E[W.T @ W] / s = I / sigma^2``.

    Subclasses implement `forward` (``x @ W.T``, fast for structured matrices) and `_resample`,
    which fills the random state (buffers) from ``self.generator``. ``matrix()`` defaults to applying
    ``forward`` to the identity.

    Args:
        num_features: ``s``, the number of rows (frequencies).
        dim: ``d``, the input dimension.
        sigma: the RBF bandwidth; rows are scaled by ``1 / sigma``.
        seed: seed of the generator the matrix is drawn from.
        generator: an explicit ``torch.Generator`` instead of ``seed``.
        device: where the matrix lives (it is drawn on the generator's device, then moved).
        dtype: floating dtype of the matrix (default: ``torch.get_default_dtype()``).
    """

    #: False for matrices whose entries are learned (``redraw`` leaves them alone).
    redrawable: bool = True
    #: True for rules whose ``component_weights`` can be negative (so can the kernel estimates built on them).
    signed_weights: bool = False

    def __init__(
        self,
        num_features: int,
        dim: int,
        *,
        sigma: float = 1.0,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self._device_arg = device
        self._dtype_arg = dtype or torch.get_default_dtype()
        self.num_features = check_positive_int("num_features", num_features)
        self.dim = check_positive_int("dim", dim)
        if not sigma > 0:
            raise ValueError(f"sigma: expected a positive bandwidth, got {sigma!r}")
        self.sigma = float(sigma)
        self.generator = make_generator(seed, generator)
        #: `cached` values by (name, dtype), each with the (device, storage, version) of every tensor then.
        self._cached: dict[tuple[str, torch.dtype], tuple[tuple[object, ...], torch.Tensor]] = {}

    @classmethod
    def symmetry_options(cls, even_in_omega: bool, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` of the constructor completed for an integrand that is (or is not) even in omega.

        The rows of most matrices serve either kind alike (``options`` unchanged); a rule with a folded
        form (``sgq``'s ``stiefel``) uses it only for even integrands.
        """
        return options

    @property
    def component_weights(self) -> torch.Tensor | None:
        """Quadrature weights ``(s,)`` summing to 1 (possibly negative), or None: every row weighs ``1/s``."""
        return None

    def matrix(self) -> torch.Tensor:
        """The dense ``W``, ``(s, d)``, in the matrix's dtype and device."""
        eye = torch.eye(self.dim, dtype=self._float_dtype(), device=self._device())
        projected: torch.Tensor = self(eye)
        return projected.mT

    def row_sqnorms(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``||omega_i||^2`` of the rows, ``(s,)``, squared in ``dtype`` (default: the matrix's).

        Kept between calls as [`cached`][rf_matrices.WeightMatrix.cached] says (structured matrices build the
        dense ``W`` for it, which costs more than a decoding step's projection).
        """
        dtype = dtype or self._float_dtype()
        return self.cached("row_sqnorms", dtype, lambda: self.matrix().to(dtype).pow(2).sum(dim=-1))

    def cached(self, name: str, dtype: torch.dtype, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``compute()``, kept under ``(name, dtype)`` until a parameter or buffer of the matrix changes.

        Only when autograd would record nothing through it (no learned entries, or grad mode off): a redraw,
        an optimizer step, a load or a move bumps a tensor's version or storage and recomputes it. Otherwise
        (and for inference tensors, which have no version, and under ``torch.compile``, which traces
        ``compute()`` into its graph) ``compute()`` runs on every call.
        """
        if torch.compiler.is_compiling():
            return compute()
        tensors = list(self._tensors())
        recorded = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
        if recorded or any(t.is_inference() for t in tensors):
            return compute()
        key = tuple((t.device, t.data_ptr(), t._version) for t in tensors)
        entry = self._cached.get((name, dtype))
        if entry is None or entry[0] != key:
            with torch.inference_mode(False), torch.no_grad():  # a tensor usable outside inference mode
                entry = (key, compute())
            self._cached[(name, dtype)] = entry
        return entry[1]

    def redraw(self, seed: int | None = None) -> None:
        """Draw the random state afresh: from ``seed`` if given, else the next draw of the generator.

        A no-op for learned matrices (``redrawable = False``).
        """
        if not self.redrawable:
            return
        if seed is not None:
            self.generator = torch.Generator(device=self.generator.device).manual_seed(seed)
        with torch.no_grad():
            self._resample()

    def _resample(self) -> None:
        raise NotImplementedError

    def get_extra_state(self) -> dict[str, torch.Tensor]:
        """The generator's state, kept in the ``state_dict`` so a restored matrix redraws as the saved one."""
        return {"generator_state": self.generator.get_state()}

    def set_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore the generator's state saved by `get_extra_state`."""
        self.generator.set_state(state["generator_state"])

    def _set_state(self, learnable: tuple[str, ...] = (), **tensors: torch.Tensor) -> None:
        """Store the drawn state: registered on the first call, overwritten in place on redraws.

        Floating tensors take the matrix's dtype; names in ``learnable`` become ``nn.Parameter``s,
        the others buffers (saved in the ``state_dict`` too, so a loaded matrix is the saved one).
        """
        for name, value in tensors.items():
            current = getattr(self, name, None)
            if current is not None:
                current.copy_(value)
                continue
            if value.is_floating_point():
                value = value.to(device=self._device_arg, dtype=self._dtype_arg)
            else:
                value = value.to(device=self._device_arg)
            if name in learnable:
                self.register_parameter(name, nn.Parameter(value))
            else:
                self.register_buffer(name, value)

    def check_input(self, x: torch.Tensor) -> None:
        """Raise a ``ValueError`` unless ``x`` is a floating tensor ``(..., d)``."""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise ValueError(f"x: expected a floating-point tensor (..., {self.dim}), got {x!r:.80}")
        if x.dim() == 0 or x.shape[-1] != self.dim:
            raise ValueError(f"x: expected last dimension {self.dim} (dim), got shape {tuple(x.shape)}")

    def _float_dtype(self) -> torch.dtype:
        return next(t.dtype for t in self._tensors() if t.is_floating_point())

    def _device(self) -> torch.device:
        return next(self._tensors()).device

    def _tensors(self) -> Iterator[torch.Tensor]:
        yield from self.parameters()
        yield from self.buffers()

    def extra_repr(self) -> str:
        """The sizes and options shown by ``repr``."""
        return f"num_features={self.num_features}, dim={self.dim}, sigma={self.sigma:g}"


class DenseWeightMatrix(WeightMatrix):
    """A weight matrix stored as a dense ``(s, d)`` buffer ``weight``; ``forward`` is one matmul.

    Subclasses implement [`sample`][rf_matrices.DenseWeightMatrix.sample] returning unit-bandwidth rows in
    float64.
    """

    def __init__(self, num_features: int, dim: int, **kw: Any) -> None:
        super().__init__(num_features, dim, **kw)
        self._resample()

    def sample(self) -> torch.Tensor:
        """Unit-bandwidth rows ``(s, d)`` in float64, drawn from ``self.generator``."""
        raise NotImplementedError

    def _resample(self) -> None:
        self._set_state(weight=self.sample() / self.sigma)

    weight: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T``: ``(..., d)`` -> ``(..., s)``."""
        self.check_input(x)
        return x @ self.weight.to(x.dtype).mT

    def matrix(self) -> torch.Tensor:
        """The stored ``W``, ``(s, d)``."""
        return self.weight
