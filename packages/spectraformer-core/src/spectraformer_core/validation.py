"""Argument checks whose errors name the argument, the value received and what was expected."""

from __future__ import annotations


def check_int(name: str, value: object, minimum: int | None = 1, *, maximum: int | None = None) -> int:
    """``value`` if it is an integer (not a bool) in ``[minimum, maximum]``, else a ``ValueError``.

    The one integer validator of the project: the error names ``name``, the value and the range.

    Args:
        name: the argument or flag (``"num_features"``, ``"--steps"``).
        value: what was given.
        minimum: the smallest allowed value (None: no lower bound).
        maximum: the largest allowed value (None: no upper bound).
    """
    low_ok = minimum is None or (isinstance(value, int) and value >= minimum)
    high_ok = maximum is None or (isinstance(value, int) and value <= maximum)
    if isinstance(value, bool) or not isinstance(value, int) or not (low_ok and high_ok):
        if minimum is not None and maximum is not None:
            expected = f"an integer in [{minimum}, {maximum}]"
        elif maximum is not None:
            expected = f"an integer <= {maximum}"
        elif minimum is not None:
            expected = f"an integer >= {minimum}"
        else:
            expected = "an integer"
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    return value


def check_positive_int(name: str, value: object) -> int:
    """``value`` if it is an integer ``>= 1``, else a ``ValueError`` naming ``name``."""
    return check_int(name, value, minimum=1)
