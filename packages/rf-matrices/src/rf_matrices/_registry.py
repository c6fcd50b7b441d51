"""A small registry of interchangeable parts, keyed by short lowercase names (timm-style).

Every family of parts in the monorepo (weight matrices here, component functions in ``rf_features``,
attentions in ``rf_attention``, ...) is one :class:`Registry`, so users add their own part with
``@register("name")`` in their own code, without editing ours.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A mapping from short lowercase names to factories (usually classes).

    Args:
        kind: what the entries are, used in error messages (e.g. ``"weight matrix"``).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, *, override: bool = False) -> Callable[[T], T]:
        """Decorator that adds a factory under ``name``.

        Args:
            name: the key, lowercase without spaces (e.g. ``"orf"``).
            override: replace an existing entry of the same name instead of raising.
        """
        if not isinstance(name, str) or not name or name != name.strip().lower() or " " in name:
            raise ValueError(f"name: expected a non-empty lowercase string without spaces, got {name!r}")

        def decorator(factory: T) -> T:
            if name in self._entries and not override:
                raise ValueError(
                    f"name: a {self.kind} named {name!r} is already registered "
                    f"({self._entries[name]!r}); pass override=True to replace it"
                )
            self._entries[name] = factory
            return factory

        return decorator

    def get(self, name: str | T) -> T:
        """The factory registered as ``name``; a non-string argument is returned as it is."""
        if not isinstance(name, str):
            return name
        key = name.lower()
        if key not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; known names: {', '.join(self.names())}")
        return self._entries[key]

    def names(self, pattern: str | None = None) -> list[str]:
        """Sorted registered names, optionally filtered by a shell-style ``pattern`` (``"fast*"``)."""
        keys = sorted(self._entries)
        return keys if pattern is None else fnmatch.filter(keys, pattern.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._entries

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
