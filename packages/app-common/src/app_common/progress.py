"""Progress bars (tqdm) that only the main process of a distributed run draws."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tqdm.auto import tqdm  # type: ignore[import-untyped]  # tqdm ships no stubs (no types-tqdm dependency)


def progress(
    iterable: Iterable[Any] | None = None,
    *,
    total: int | None = None,
    desc: str | None = None,
    initial: int = 0,
    disable: bool = False,
    **kw: Any,
) -> tqdm:
    """A tqdm bar on stderr; ``disable=True`` (e.g. on ranks other than 0) draws nothing.

    Args:
        iterable: what to iterate over (or None and call ``update`` by hand).
        total: the number of steps (e.g. the step budget).
        desc: the label in front of the bar.
        initial: steps already done (a resumed run starts its bar there).
        disable: draw nothing.
        **kw: other ``tqdm`` arguments.
    """
    return tqdm(iterable, total=total, desc=desc, initial=initial, disable=disable, dynamic_ncols=True, **kw)
