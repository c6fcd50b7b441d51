"""A registry of interchangeable parts keyed by short lowercase names (timm-style).

Every family of parts in the monorepo (weight matrices, component functions, attentions, layer kinds,
activations, ...) is one [`Registry`][spectraformer_core.Registry], so users add their own part with
``@register("name")`` in their own code, without editing ours.
"""

from __future__ import annotations

import difflib
import fnmatch
import textwrap
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A mapping from short lowercase names to factories (usually classes).

    Args:
        kind: what the entries are, used in error messages (e.g. ``"weight matrix"``).
        family: maps a name to the family it is listed under in the unknown-name error (for example the
            component of an ``"<component>-<matrix>"`` attention); ``None`` lists the names in one group.
    """

    def __init__(self, kind: str, *, family: Callable[[str], str] | None = None) -> None:
        self.kind = kind
        self.family = family
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

    def unregister(self, name: str) -> T:
        """Remove ``name`` and return its factory (to undo a temporary registration, as in a test).

        Raises:
            ValueError: an unknown name, with the message of [`get`][spectraformer_core.Registry.get].
        """
        factory = self.get(name)
        del self._entries[name.lower()]
        return factory

    def get(self, name: str | T) -> T:
        """The factory registered as ``name``; a non-string argument is returned as it is.

        Raises:
            ValueError: an unknown name; the message suggests the closest names first, then lists the
                known names by family.
        """
        if not isinstance(name, str):
            return name
        key = name.lower()
        if key not in self._entries:
            raise ValueError(self.unknown_name_message(name))
        return self._entries[key]

    def unknown_name_message(self, name: str) -> str:
        """The error text for an unknown ``name``: closest names first, then the known names by family."""
        closest = difflib.get_close_matches(name.lower(), self.names(), n=3, cutoff=0.6)
        lines = [f"unknown {self.kind} {name!r}"]
        if closest:
            quoted = [repr(c) for c in closest]
            options = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
            lines[0] += f"; did you mean {options}?"
        groups: dict[str, list[str]] = {}
        for key in self.names():
            groups.setdefault(self.family(key) if self.family else "", []).append(key)
        lines.append("known names by family:" if self.family else "known names:")
        for family, members in groups.items():
            text = f"{family}: {', '.join(members)}" if family else ", ".join(members)
            lines.extend(
                textwrap.wrap(
                    text, 100, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False
                )
            )
        return "\n".join(lines)

    def names(self, pattern: str | None = None) -> list[str]:
        """Sorted registered names, optionally filtered by a shell-style ``pattern`` (``"fast*"``)."""
        keys = sorted(self._entries)
        return keys if pattern is None else fnmatch.filter(keys, pattern.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._entries

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
