"""Hardware-free counts of a step: the aten operations it dispatches and the matmul FLOPs it does.

Both are deterministic (no timing, no dependence on the input values or on the machine's load): the
operation count stands in for the kernel launches the step issues on a GPU (each a few microseconds
there, whatever its size), the FLOP count (``torch.utils.flop_counter.FlopCounterMode``: matrix
products, convolutions and SDPA, not elementwise work) shows whether the work per token grows with N.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import rf_attention


class OperationCounter(TorchDispatchMode):
    """Counts the aten operator calls (views included) dispatched while active (``counts``, ``total``)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.counts[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        """Operator calls counted so far."""
        return sum(self.counts.values())


def operations(fn: Callable[[], object]) -> int:
    """Aten operator calls of one ``fn()``."""
    with OperationCounter() as counter:
        fn()
    return counter.total


def matmul_flops(fn: Callable[[], object]) -> int:
    """FLOPs of the matrix products (and SDPA) of one ``fn()``, counted by ``FlopCounterMode``."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def training_step(
    name: str, n: int, *, causal: bool, batch: int, dim: int, heads: int, features: int
) -> Callable[[], None]:
    """A training forward+backward of ``rf_attention.create(name, dim, heads, ...)`` on ``x (batch, n, dim)``.

    The module has made one step on a short prefix first, so that lazily built constants are not counted.
    """
    torch.manual_seed(0)
    module = rf_attention.create(name, dim, heads, num_features=features, causal=causal, seed=0).train()
    x = torch.randn(batch, n, dim, requires_grad=True)
    module(x[:, : min(n, 64)]).sum().backward()
    return lambda: module(x).sum().backward()


def decode_step(name: str, *, dim: int, heads: int, features: int, prefix: int = 64) -> Callable[[], None]:
    """One ``step()`` of the causal ``rf_attention.create(name, dim, heads, ...).eval()`` after a prefill.

    The state comes from ``prefill`` of ``prefix`` tokens and one uncounted step (a KV cache grows there);
    every call of the returned function continues from that same state.
    """
    torch.manual_seed(0)
    module = rf_attention.create(name, dim, heads, num_features=features, causal=True, seed=0).eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, prefix + 2, dim, generator=g)
    with torch.no_grad():
        _, state = module.prefill(x[:, :prefix])
        _, state = module.step(x[:, prefix : prefix + 1], state)
    token = x[:, prefix + 1 :]

    def step() -> None:
        with torch.no_grad():
            module.step(token, state)

    return step
