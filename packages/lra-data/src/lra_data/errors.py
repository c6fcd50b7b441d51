"""Exceptions raised on bad input files and caches."""

from __future__ import annotations

from pathlib import Path


class DataFormatError(ValueError):
    """A source file does not hold what its format promises (malformed line, label out of range, ...).

    The message starts with ``path:line:`` when the fault sits on one line of a text file, or with the
    path alone for binary files, and says what was found and what was expected.
    """

    def __init__(self, path: str | Path, message: str, *, line: int | None = None):
        self.path = Path(path)
        self.line = line
        where = f"{path}:{line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {message}")


class CacheError(ValueError):
    """A cache folder written by ``lra-data prepare``/``generate`` is missing, incomplete or corrupted."""
