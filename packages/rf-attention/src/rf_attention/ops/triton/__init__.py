"""Triton kernels of random-feature attention (optional; imported only when the Triton backend runs).

One module per mode, as flash-linear-attention lays out its ops:
[`noncausal`][rf_attention.ops.triton.noncausal],
[`chunk`][rf_attention.ops.triton.chunk] (causal, chunk by chunk with the state passed between chunks) and
[`fused_recurrent`][rf_attention.ops.triton.fused_recurrent] (one decoding step). The kernels take a
[`ClosedForm`][rf_attention.ops.features.ClosedForm] and compute the features inside the kernel from
``x @ projection`` and the log-scale terms; features are never written to global memory.

This module itself imports no Triton: it only decides which backend a call runs on.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Literal

import torch

#: The values of ``backend=``.
Backend = Literal["auto", "torch", "triton"]
BACKENDS: tuple[str, ...] = ("auto", "torch", "triton")


def interpreting() -> bool:
    """Whether Triton runs its interpreter (env ``TRITON_INTERPRET=1``): kernels on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_installed() -> bool:
    """Whether ``triton`` can be imported (checked without importing it)."""
    return importlib.util.find_spec("triton") is not None


def check_backend(backend: str) -> None:
    """A ``ValueError`` naming the argument and the choices unless ``backend`` is one of ``BACKENDS``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")


def uses_triton(backend: str, x: torch.Tensor, *, closed_form: str | None) -> bool:
    """Whether a call on ``x`` runs the Triton kernels, for ``backend`` ``"auto" | "torch" | "triton"``.

    ``auto``: Triton for CUDA tensors of float32/float16/bfloat16 with a closed form when triton imports,
    else PyTorch (CPU tensors too under ``TRITON_INTERPRET=1``, and while ``torch.compile`` traces: the
    kernels' autograd functions are not registered as custom operators, the PyTorch path compiles whole).
    ``"triton"``: refused (``ValueError``) on CPU tensors unless ``TRITON_INTERPRET=1``, for float64 (the
    kernels accumulate in float32) and for a feature map without a closed form.

    Args:
        backend: the ``backend=`` argument.
        x: a tensor of the call (its device and dtype decide).
        closed_form: None if the features have a closed form, else the name of the map that has none.
    """
    check_backend(backend)
    if backend == "torch":
        return False
    kernel_dtype = x.dtype in (torch.float32, torch.float16, torch.bfloat16)
    if backend == "auto":  # never the interpreter (it is for tests), nor inside torch.compile
        compiling = torch.compiler.is_compiling()
        return x.is_cuda and kernel_dtype and closed_form is None and not compiling and triton_installed()
    on_device = x.is_cuda or interpreting()
    if not triton_installed():
        raise ValueError(
            "backend: 'triton' needs the triton package (pip install triton); it is not installed"
        )
    if not on_device:
        raise ValueError(
            f"backend: 'triton' runs on CUDA tensors (or on CPU tensors under the interpreter, env "
            f"TRITON_INTERPRET=1); got a {x.device.type} tensor without TRITON_INTERPRET=1"
        )
    if not kernel_dtype:
        raise ValueError(
            f"backend: 'triton' accumulates in float32 and takes float32/float16/bfloat16 inputs, got "
            f"{x.dtype}; use backend='torch'"
        )
    if closed_form is not None:
        raise ValueError(
            f"backend: 'triton' needs a feature map with a closed form (rf_features.ExponentialForm); "
            f"{closed_form} has none, use backend='torch' or 'auto'"
        )
    return True
