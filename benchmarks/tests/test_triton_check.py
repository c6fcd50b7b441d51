"""``triton_check``'s command line and report on the CPU (the measurements themselves need a CUDA device)."""

import pytest
import torch

from spectraformer_benchmarks import triton_check


def test_defaults_are_the_prepared_command():
    args = triton_check.parse_args([])
    assert (args.batch, args.heads, args.head_dim, args.features) == (8, 8, 64, 128)
    assert args.lengths == [4096, 8192, 16384, 32768, 65536]
    assert args.budget < 600  # inside a 10-minute call, with the tests and the start-up before it


def test_a_name_that_is_no_pair_is_refused(capsys):
    with pytest.raises(SystemExit):
        triton_check.parse_args(["--pairs", "softmax"])
    assert "--pairs: 'softmax' is not a '<component>-<matrix>' pair" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where no CUDA device is")
def test_without_a_cuda_device_it_stops_with_the_reason():
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        triton_check.main(["--device", "cpu", "--skip", "tests"])


def test_report_tables_show_times_skipped_points_and_errors():
    row = {
        "pair": "posrf-orf",
        "causal": True,
        "n": 4096,
        "sdpa": {"ms": 2.5},
        "triton": {"ms": 1.25},
        "torch": {"skipped": True},
        "materialized": {"error": "RuntimeError: out of memory"},
    }
    results = {
        "device": "H100",
        "date": "today",
        "training": [row],
        "tests": {"exit_code": 0, "summary": "ok"},
    }
    lines = triton_check.markdown(results)
    assert "| pair | causal | N | sdpa | triton | torch | materialized |" in lines
    assert "| posrf-orf | True | 4096 | 2.50 | 1.25 | skipped | error |" in lines
    assert "Tests: exit code 0, ok" in lines
