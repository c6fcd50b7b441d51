"""The benchmarks' counts are exact on small sizes: FLOPs of known products, operations of known sequences."""

import json

import pytest
import torch

from spectraformer_benchmarks import causal
from spectraformer_benchmarks.counting import OperationCounter, matmul_flops, operations


def test_the_flops_of_a_matmul_are_two_m_n_k():
    a, b = torch.randn(6, 5), torch.randn(5, 7)
    assert matmul_flops(lambda: a @ b) == 2 * 6 * 7 * 5


def test_the_flops_of_a_batched_matmul_are_two_m_n_k_per_batch():
    a, b = torch.randn(3, 4, 6, 5), torch.randn(3, 4, 5, 7)
    assert matmul_flops(lambda: a @ b) == 3 * 4 * 2 * 6 * 7 * 5


def test_elementwise_work_has_no_matmul_flops():
    a = torch.randn(64, 64)
    assert matmul_flops(lambda: (a.exp() * a).sum()) == 0


def test_the_operation_counter_counts_each_aten_call_once():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with OperationCounter() as counter:
        ((a + b) * 2).sum()
    assert dict(counter.counts) == {"add": 1, "mul": 1, "sum": 1}


def test_operations_counts_views_too():
    a = torch.randn(4, 6)
    assert operations(lambda: a.view(6, 4).t().contiguous()) == 3


def test_noncausal_posrf_flops_per_token_do_not_depend_on_the_length():
    assert causal.flops_per_token("posrf-orf", 128, causal=False) == causal.flops_per_token(
        "posrf-orf", 512, causal=False
    )


@pytest.mark.parametrize("name", ["trigrf-sorf", "oprf-fastfoodl", "posrf-hyp-qmc"])
def test_noncausal_flops_grow_by_equal_steps_for_equal_steps_of_the_length(name):
    total = {n: n * causal.flops_per_token(name, n, causal=False) for n in (128, 256, 384)}
    assert total[384] - total[256] == total[256] - total[128]


# FakeTensorMode's own dispatch reads ``.grad`` of a non-leaf while it replays SADERF's backward pass (torch
# warns from inside fake_tensor.py, not from the attention code).
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf Tensor:UserWarning")
@pytest.mark.parametrize("is_causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("name", ["softmax", "posrf-orf", "saderf-sorf"])
def test_flops_counted_on_fake_tensors_equal_those_counted_on_real_ones(name, is_causal):
    real = matmul_flops(causal.attention_step(name, 192, causal=is_causal)) / 192
    assert causal.flops_per_token(name, 192, causal=is_causal) == real


def test_the_table_gives_each_pair_its_ratios_to_sdpa(tmp_path):
    points = [
        {"attention": "softmax", "n": 8192, "quantity": "time", "seconds": 6.0},
        {"attention": "posrf-orf", "n": 8192, "quantity": "time", "seconds": 2.0},
        {"attention": "softmax", "n": 8192, "quantity": "memory", "peak_mib": 40.0},
        {"attention": "posrf-orf", "n": 8192, "quantity": "memory", "peak_mib": 60.0},
    ]
    (tmp_path / "measure.json").write_text(json.dumps({"results": points}))
    (tmp_path / "decode.json").write_text(json.dumps([{"attention": "posrf-orf", "decode_step": 30}]))
    (row,) = [line for line in causal.table(tmp_path).splitlines() if line.startswith("| `posrf-orf`")]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[2] == "3.00x"  # speed at 8K: 6 s / 2 s
    assert cells[4] == "1.50x"  # memory at 8K: 60 MiB / 40 MiB
    assert cells[-1] == "30"  # decode step operations
