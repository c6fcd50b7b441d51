"""Unpickling downloaded data files (CIFAR batches, pre-processed LRA pickles) without running code from them.

A pickle names the callables it calls on loading by ``module.name``; `pickle.load` imports and calls
whatever the file names, so a crafted file runs code (``os.system``) when it is read. Data files hold
built-in containers, numbers, strings and bytes, which pickle stores without naming any global, and numpy
arrays, dtypes and scalars. [`load_pickle`][spectraformer_core.load_pickle] resolves exactly the globals
that numpy's own pickles of those name
([`ALLOWED_PICKLE_GLOBALS`][spectraformer_core.ALLOWED_PICKLE_GLOBALS]) and refuses every other one before
anything is imported or called (the restriction of ``find_class`` that the `pickle` documentation
recommends under "Restricting Globals").
"""

from __future__ import annotations

import codecs
import pickle
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import IO, Any, cast

import numpy as np


def _reducer(value: object, protocol: int) -> object:
    """The callable numpy's pickle of ``value`` under ``protocol`` names (first item of ``__reduce_ex__``).

    Taken from numpy itself, so the table below holds the installed numpy's own functions whatever its
    version calls their module, and building it never imports a deprecated module path.
    """
    return cast(tuple[Any, ...], value.__reduce_ex__(protocol))[0]


_NUMPY_CORE = ("numpy.core", "numpy._core")
"""The module path of numpy's internals under numpy 1.x and 2.x; files written by either are read."""

ALLOWED_PICKLE_GLOBALS: Mapping[tuple[str, str], object] = MappingProxyType(
    {
        # An array under pickle protocols 0-4: _reconstruct(ndarray, shape, dtype), then its state.
        **{(f"{core}.multiarray", "_reconstruct"): _reducer(np.zeros(1), 2) for core in _NUMPY_CORE},
        ("numpy", "ndarray"): np.ndarray,
        # A contiguous array under protocol 5 (Python 3.14's default): _frombuffer(buffer, dtype, shape, ...).
        **{(f"{core}.numeric", "_frombuffer"): _reducer(np.zeros(1), 5) for core in _NUMPY_CORE},
        # Every array's and scalar's dtype: dtype(code, align, copy), then its state.
        ("numpy", "dtype"): np.dtype,
        # A numpy scalar (the pre-processed LRA pickles' labels): scalar(dtype, raw bytes).
        **{(f"{core}.multiarray", "scalar"): _reducer(np.int64(0), 2) for core in _NUMPY_CORE},
        # Bytes written by Python 3 under protocols 0-2 (an array's data): encode(text, "latin1"); empty
        # bytes as bytes(), under the Python 2 name that pickle writes for those protocols.
        ("_codecs", "encode"): codecs.encode,
        ("__builtin__", "bytes"): bytes,
    }
)
"""``(module, name)``, as a pickle spells it -> its object: the only globals a data file may name."""


class RefusedGlobalError(pickle.UnpicklingError):
    """A pickle names a global outside [`ALLOWED_PICKLE_GLOBALS`][spectraformer_core.ALLOWED_PICKLE_GLOBALS].

    Attributes:
        global_name: the refused global, ``module.name`` (``posix.system``).
    """

    def __init__(self, global_name: str) -> None:
        self.global_name = global_name
        super().__init__(
            f"refused global {global_name}: a data file may hold only built-in values and numpy arrays, "
            "dtypes and scalars (loading anything else could run code from the file)"
        )


class _DataUnpickler(pickle.Unpickler):
    """A `pickle.Unpickler` that resolves only the allowed globals and imports nothing."""

    def find_class(self, module: str, name: str) -> Callable[..., Any]:
        # Every way a pickle names a global (GLOBAL, STACK_GLOBAL, INST, OBJ, EXT*) goes through here, with
        # the names as the file spells them.
        found = ALLOWED_PICKLE_GLOBALS.get((module, name))
        if found is None:
            raise RefusedGlobalError(f"{module}.{name}")
        return cast(Callable[..., Any], found)


def load_pickle(file: IO[bytes], *, encoding: str = "ASCII") -> object:
    """The object pickled in the binary ``file``, built from allowed globals only.

    Args:
        file: the open binary file.
        encoding: how Python 2 ``str`` objects are decoded (``"bytes"`` keeps them as bytes, the usual
            way to read CIFAR's batches).

    Raises:
        RefusedGlobalError: the file names a global outside
            [`ALLOWED_PICKLE_GLOBALS`][spectraformer_core.ALLOWED_PICKLE_GLOBALS]; nothing it names has
            been imported or called.
        pickle.UnpicklingError: (and ``EOFError``, ``ValueError``, ...) the file is not a valid pickle, as
            from `pickle.load`.
    """
    return _DataUnpickler(file, encoding=encoding).load()
