"""Fixtures shared by the rf-attention tests."""

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for the module's tests (tiny models: threads only add overhead)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
