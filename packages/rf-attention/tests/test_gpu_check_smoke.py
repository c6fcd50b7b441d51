"""``benchmarks/gpu_check.py --smoke`` on the CPU: the GPU check's operation and SDPA parts run and report."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu_check.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SCRIPT.exists(), reason="benchmarks/ is not in this checkout"),
    pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`"),
]


def test_smoke_run_reports_operations_and_sdpa(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    # correctness, scaling and decoding run other scripts (and app_common); inductor on the CPU is
    # test_compile.py's (minutes more here); the operation and SDPA parts are tested here
    skip = ["correctness", "scaling", "decoding", "compile"]
    gpu_check.main(["--device", "cpu", "--smoke", "--skip", *skip, "--out", str(tmp_path)])
    report = (tmp_path / "report.md").read_text()
    for heading in ("## Operations", "## Forward+backward against SDPA"):
        assert heading in report
    assert "posrf-orf causal" in report
