"""Fixtures shared by the rf-attention tests."""

import pytest

from spectraformer_core.testing import torch_threads


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for the module's tests (tiny models and token loops: threads only add overhead)."""
    with torch_threads(1):
        yield
