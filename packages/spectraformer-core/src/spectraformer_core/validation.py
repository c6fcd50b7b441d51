"""Argument checks whose errors name the argument, the value received and what was expected."""

from __future__ import annotations


def check_int(name: str, value: object, *, minimum: int = 1) -> int:
    """``value`` if it is an integer ``>= minimum`` (not a bool), else a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return value


def check_positive_int(name: str, value: object) -> int:
    """``value`` if it is an integer ``>= 1``, else a ``ValueError`` naming ``name``."""
    return check_int(name, value, minimum=1)
