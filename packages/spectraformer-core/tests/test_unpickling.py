"""`load_pickle` builds numpy arrays, dtypes and scalars and refuses every other global, running nothing."""

import io
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from spectraformer_core import ALLOWED_PICKLE_GLOBALS, RefusedGlobalError, load_pickle


class Payload:
    """Pickles as the call ``function(*args)``: what a crafted data file runs when it is loaded."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


def test_a_global_outside_the_allowed_ones_is_refused_by_name():
    raw = pickle.dumps({b"data": Payload(os.system, "true")})
    with pytest.raises(RefusedGlobalError) as error:
        load_pickle(io.BytesIO(raw))
    assert error.value.global_name == f"{os.system.__module__}.system"


def test_a_refused_payload_never_runs(tmp_path):
    marker = tmp_path / "marker"
    raw = pickle.dumps([Payload(Path.write_text, marker, "the payload ran")])
    with pytest.raises(RefusedGlobalError):
        load_pickle(io.BytesIO(raw))
    assert not marker.exists()


def test_the_payload_runs_under_plain_pickle(tmp_path):
    """The control for the test above: the payload is live, so its absence there is the unpickler's doing."""
    marker = tmp_path / "marker"
    pickle.loads(pickle.dumps([Payload(Path.write_text, marker, "the payload ran")]))
    assert marker.read_text() == "the payload ran"


def data_values() -> list:
    """What data files hold: arrays (contiguous or not, empty), numpy scalars, bytes (empty or not)."""
    return [np.arange(6, dtype=np.int32), np.arange(6.0)[::2], np.zeros(0, np.uint8), np.int64(3), b"", b"ab"]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_arrays_scalars_and_bytes_of_every_protocol_read_back_equal(protocol):
    values = data_values()
    loaded = load_pickle(io.BytesIO(pickle.dumps(values, protocol)))
    assert [(type(v), getattr(v, "dtype", None)) for v in loaded] == [
        (type(v), getattr(v, "dtype", None)) for v in values
    ]
    assert all(np.array_equal(a, b) for a, b in zip(loaded, values, strict=True))


class RecordingUnpickler(pickle.Unpickler):
    """A plain unpickler that records the globals a pickle names."""

    def __init__(self, raw: bytes, names: set):
        super().__init__(io.BytesIO(raw))
        self.names = names

    def find_class(self, module, name):
        self.names.add((module, name))
        return super().find_class(module, name)


def test_the_allowed_globals_are_exactly_those_numpy_and_bytes_name():
    """Allowed: what arrays, scalars and bytes name in protocols 0-5 under numpy 2.x and 1.x; nothing more."""
    named: set = set()
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        RecordingUnpickler(pickle.dumps(data_values(), protocol), named).load()
    numpy_1 = {(module.replace("numpy._core.", "numpy.core."), name) for module, name in named}
    assert set(ALLOWED_PICKLE_GLOBALS) == named | numpy_1
