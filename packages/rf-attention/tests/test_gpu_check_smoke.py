"""``benchmarks/gpu_check.py --smoke`` on the CPU: the GPU check's kernel parts run and write their report."""

import importlib.util
import shutil
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu_check.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SCRIPT.exists(), reason="benchmarks/ is not in this checkout"),
    pytest.mark.skipif(
        shutil.which("cc") is None and shutil.which("gcc") is None,
        reason="the compile part needs torch.compile's CPU backend, which needs a C compiler",
    ),
    pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`"),
]


def test_smoke_run_reports_operations_compile_and_sdpa(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    # correctness, scaling and decoding run other scripts (and app_common); the kernel parts are tested here
    gpu_check.main(
        ["--device", "cpu", "--smoke", "--skip", "correctness", "scaling", "decoding", "--out", str(tmp_path)]
    )
    report = (tmp_path / "report.md").read_text()
    for heading in ("## Operations", "## torch.compile", "## Forward+backward against SDPA"):
        assert heading in report
    assert "posrf-orf causal" in report
