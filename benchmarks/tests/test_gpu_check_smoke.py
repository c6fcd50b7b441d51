"""``gpu_check --smoke`` on the CPU: the operation and SDPA parts run and report, causal SDPA included."""

import pytest

from spectraformer_benchmarks import gpu_check

pytestmark = pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    # scaling and decoding start the other benchmarks in fresh processes, and inductor on the CPU is
    # rf-attention's test_compile.py's: minutes more here
    skip = ["scaling", "decoding", "compile"]
    gpu_check.main(["--device", "cpu", "--smoke", "--skip", *skip, "--out", str(out)])
    return (out / "report.md").read_text()


def test_the_report_has_the_operation_and_sdpa_sections(report):
    assert "## Operations" in report
    assert "## Forward+backward against SDPA" in report


def test_causal_rows_are_measured_against_causal_sdpa(report):
    sdpa_part = report.split("## Forward+backward against SDPA", 1)[1]
    rows = [line.split(" | ") for line in sdpa_part.splitlines() if line.startswith("| softmax causal |")]
    assert len(rows) == 2  # N = 256 and 512
    assert all(row[3] == "1.00x" for row in rows)  # the reference of the causal rows is causal SDPA itself
    assert "| posrf-orf causal | 256 |" in sdpa_part
