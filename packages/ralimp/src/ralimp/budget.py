"""How each layer kind spends a feature budget: the counting rules behind `ralimp.create`.

Two ways of counting a budget ``B`` (``count=``):

- ``"paper"``: the random features as the paper counts them (``num_random_features``): the rows of one
  projection for EUGen and SNNK, the rank for LowRank, and for RaLiMP ``m_poly + 2 J n_freq m`` (App. D.1).
- ``"width"``: the width ``F`` of ``Phi(x)`` (``feature_dim``), what the readout and the compressed layer
  cost: ``1 + K m`` for EUGen, ``2 m`` for the Fourier SNNK, ``r`` for LowRank,
  ``1 + K m_poly + 2 J n_freq m`` for RaLiMP.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spectraformer_core import check_int

#: The counting rules of a budget.
COUNTS = ("paper", "width")

#: Share of a RaLiMP budget given to the rational block when neither block's size is fixed (App. D.1's
#: 24 of 32).
RATIONAL_SHARE = 0.75


class BudgetError(ValueError):
    """A layer kind cannot spend a budget exactly (with the given overrides)."""


def check_count(count: object) -> str:
    """``count`` if it is a known counting rule, else a ``ValueError``."""
    if count not in COUNTS:
        raise ValueError(f"count: expected one of {COUNTS}, got {count!r}")
    return count


def check_budget(budget: object) -> int:
    """``budget`` if it is an integer >= 1, else a `BudgetError`."""
    try:
        return check_int("budget", budget)
    except ValueError as error:
        raise BudgetError(str(error)) from None


def exact_share(rest: int, per: int, what: str, budget: int) -> int:
    """``rest / per`` when it is an integer >= 1, else a `BudgetError` naming ``what``."""
    if rest < per or rest % per:
        raise BudgetError(
            f"budget: {budget} leaves {rest} features for {what}, not a positive multiple of {per}"
        )
    return rest // per


def ralimp_split(
    budget: int,
    count: str,
    *,
    poly_degree: int,
    num_atoms: int,
    num_freqs: int,
    poly_features: int | None = None,
    freq_features: int | None = None,
) -> dict[str, int]:
    r"""``poly_features`` and ``freq_features`` of a RaLiMP that spends ``budget`` exactly.

    $B = m_\mathrm{poly} + 2 J n m$ (``count="paper"``) or $B = 1 + K m_\mathrm{poly} + 2 J n m$
    (``"width"``). One of the two sizes may be fixed by the caller; else the rational block takes the largest
    $m$ with $2 J n m \le 0.75 B$ that leaves a valid polynomial block (App. D.1:
    $8 + 2 \cdot 3 \cdot 4 = 32$).
    """
    if poly_features is not None and freq_features is not None:
        raise BudgetError(
            "budget: poly_features and freq_features are both set; the budget fixes one, set only the other"
        )
    offset, poly_per = (0, 1) if count == "paper" else (1, poly_degree)
    per_row = 2 * num_atoms * num_freqs
    rest = budget - offset
    if num_atoms == 0 or poly_degree == 0:
        if num_atoms == 0 and poly_degree == 0:
            raise BudgetError("budget: a RaLiMP with poly_degree=0 and num_atoms=0 has no random features")
        if num_atoms == 0:
            return {"poly_features": exact_share(rest, poly_per, "the polynomial block", budget)}
        return {"freq_features": exact_share(rest, per_row, "the rational block", budget)}
    if freq_features is not None:
        m_poly = exact_share(rest - per_row * freq_features, poly_per, "the polynomial block", budget)
        return {"poly_features": m_poly, "freq_features": freq_features}
    if poly_features is not None:
        m = exact_share(rest - poly_per * poly_features, per_row, "the rational block", budget)
        return {"poly_features": poly_features, "freq_features": m}
    for m in range(int(RATIONAL_SHARE * rest) // per_row, 0, -1):
        left = rest - per_row * m
        if left >= poly_per and left % poly_per == 0:
            return {"poly_features": left // poly_per, "freq_features": m}
    raise BudgetError(
        f"budget: {budget} is too small for a polynomial block and {num_atoms} atom(s) x {num_freqs} nodes "
        f"({per_row} rational features per projection)"
    )


def nearest_valid(policy: Callable[[int], object], budget: int, span: int = 4096) -> list[int]:
    """The nearest budgets below and above ``budget`` that ``policy`` accepts (at most one each)."""
    found = []
    for direction in (-1, 1):
        for step in range(1, span):
            candidate = budget + direction * step
            if candidate < 1:
                break
            try:
                policy(candidate)
            except BudgetError:
                continue
            found.append(candidate)
            break
    return found


def refuse_fixed(name: str, overrides: dict[str, Any]) -> None:
    """A `BudgetError` when ``overrides`` sets the size the budget decides."""
    if name in overrides:
        raise BudgetError(f"{name}: set by the budget, got {name}={overrides[name]!r} as well")
