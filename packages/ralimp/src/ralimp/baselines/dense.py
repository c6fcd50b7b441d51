r"""The dense reference: ``activation(linear(x))`` itself."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ralimp.base import Elementwise, ExactActivation, LinearSource
from ralimp.budget import BudgetError, check_count


class Dense(ExactActivation):
    """``activation(linear(x))`` itself: the dense reference, `ralimp.create`'s ``"dense"``.

    Args:
        in_features: ``d``.
        out_features: ``l``.
        activation: registered name or elementwise callable (applied exactly).
        bias: learn a bias.
        seed: accepted for a call uniform with the other kinds; nothing is random.
        device: where parameters live.
        dtype: parameter dtype.
    """

    #: A dense layer has no random features; its budget is None.
    num_random_features = None

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        activation: str | Elementwise = "gelu",
        bias: bool = True,
        seed: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        factory = self.set_up(in_features, out_features, activation, device, dtype)
        self.linear = nn.Linear(in_features, out_features, bias=bias, **factory)

    @property
    def feature_dim(self) -> int:
        """The hidden width ``l``."""
        return self.out_features

    @classmethod
    def budget_options(
        cls, budget: int | None, activation: object = None, *, count: str = "paper", **overrides: Any
    ) -> dict[str, int]:
        """No options: the dense layer spends no random features, so ``budget`` must be None."""
        check_count(count)
        if budget is not None:
            raise BudgetError(
                f"budget: the dense layer has no random features; expected None, got {budget!r}"
            )
        return {}

    def initialize_from(self, source: LinearSource) -> None:
        """A copy of ``linear`` (exact: ``sample`` and ``init`` change nothing)."""
        self.linear.load_state_dict(source.linear.state_dict())

    def linear_map(self, x: torch.Tensor) -> torch.Tensor:
        """``W x + b``."""
        return self.linear(x)
