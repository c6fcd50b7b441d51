"""Tests train tiny layers: one CPU thread is the fastest, and robust on a shared machine."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
