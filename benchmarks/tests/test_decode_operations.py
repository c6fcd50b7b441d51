"""Operations of one decode ``step()`` of every kind of RF pair: exact counts, the same after any context."""

import json
import subprocess
import sys

import pytest
import torch

import rf_attention
from spectraformer_benchmarks.counting import OperationCounter
from spectraformer_core.testing import torch_threads

#: At most this many aten operations in one ``step()`` of ``create(pair, 256, 4, num_features=128,
#: causal=True)`` and in its ``decode`` call, by feature kind (softmax's KV-cache step issues 21 here).
STEP_OPERATIONS = {"positive": (28, 19), "trigonometric": (42, 33)}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Loops of tiny operations: one thread is fastest."""
    with torch_threads(1):
        yield


def step_counts(name, context):
    """Aten calls of one eval ``step()`` after ``context`` tokens, and of its ``decode`` call alone."""
    module = rf_attention.create(name, 256, 4, num_features=128, causal=True, seed=0).eval()
    x = torch.randn(2, context + 1, 256, generator=torch.Generator().manual_seed(0))
    core = []
    original = module.step_heads

    def counted(*args):
        with OperationCounter() as inner:
            result = original(*args)
        core.append(inner.total)
        return result

    with torch.no_grad():
        _, state = module.prefill(x[:, : context - 1])
        _, state = module.step(x[:, context - 1 : context].contiguous(), state)  # lays out the map
        token = x[:, context:].contiguous()
        module.step_heads = counted
        with OperationCounter() as whole:
            module.step(token, state)
    return whole.total, core[-1]


def within(counts, budget):
    return all(count <= most for count, most in zip(counts, budget, strict=True))


def fresh_step_count(name, tmp_path):
    """Aten calls of one decode ``step()`` counted by the benchmark in a fresh process (no test's state)."""
    out = tmp_path / "decode.json"
    command = [sys.executable, "-m", "spectraformer_benchmarks.operation_counts", "--decode"]
    subprocess.run(
        [*command, "--attentions", "softmax", name, "--out", str(out)], check=True, capture_output=True
    )
    return {row["attention"]: row["decode_step"] for row in json.loads(out.read_text())}[name]


@pytest.mark.parametrize("name", ["posrf-orf", "gerf-fastfoodl", "oprf-orf", "saderf-sorf", "posrf-hyp-qmc"])
def test_a_step_of_positive_features_issues_its_operation_budget(name, tmp_path):
    assert fresh_step_count(name, tmp_path) <= STEP_OPERATIONS["positive"][0]


@pytest.mark.parametrize("name", ["trigrf-orf", "trigrf-fastfoodl"])
def test_a_step_of_trigonometric_features_issues_its_operation_budget(name, tmp_path):
    assert fresh_step_count(name, tmp_path) <= STEP_OPERATIONS["trigonometric"][0]


def test_the_attention_core_of_a_step_issues_its_operation_budget():
    assert within(step_counts("posrf-orf", 8), STEP_OPERATIONS["positive"])


def test_a_step_issues_as_many_operations_after_any_context():
    assert step_counts("oprf-fastfoodl", 3) == step_counts("oprf-fastfoodl", 300)
