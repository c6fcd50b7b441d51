"""Every Triton kernel compiled ahead of time for sm_80 (A100) and sm_90 (H100), no GPU needed.

``triton.compile`` with the bundled ``ptxas`` at the launch configuration (blocks and options of the
kernel's module) for ``Dh = 64`` and 128 features, every optional part on (mask, signs, waves), asserting
that the shared memory a program asks for fits one block's opt-in maximum on that architecture. Runs in the
``tests-triton`` nox session (``TRITON_INTERPRET=1``) and on a CUDA device.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
if not INTERPRETING and not torch.cuda.is_available():
    pytest.skip(
        "the Triton kernels are compiled in the tests-triton session (TRITON_INTERPRET=1) or on a GPU",
        allow_module_level=True,
    )
pytest.importorskip("triton")

#: Shared memory one block may opt in to (``cudaDevAttrMaxSharedMemoryPerBlockOptin``), bytes.
SHARED_MEMORY = {80: 163 * 1024, 90: 227 * 1024}
KERNELS = [
    "noncausal.key_sums_kernel",
    "noncausal.query_outputs_kernel",
    "noncausal.query_grads_kernel",
    "noncausal.key_grads_kernel",
    "chunk.chunk_forward_kernel",
    "chunk.chunk_query_grads_kernel",
    "chunk.chunk_key_grads_kernel",
    "fused_recurrent.fused_recurrent_kernel",
]
#: Compiles one kernel for each architecture and prints its shared memory per architecture (JSON). Run in
#: a fresh process without TRITON_INTERPRET: under the interpreter, kernels are not compilable functions.
COMPILE = """
import importlib, json, sys
import triton
from triton.backends.compiler import GPUTarget

module_name, kernel_name = sys.argv[1].split(".")
module = importlib.import_module("rf_attention.ops.triton." + module_name)
kernel = getattr(module, kernel_name)
blocks = {"BN": getattr(module, "BLOCK_ROWS", 0), "BC": getattr(module, "DEFAULT_CHUNK", 0), "BW": 128}
sizes = {"BD": 64, "BM": 128, "BV": 64, **blocks, "HAS_MASK": True, "HAS_SIGN": True, "TRIG": True}
constexprs = {name: value for name, value in sizes.items() if name in kernel.arg_names}
types = {}
for name in kernel.arg_names:
    if name in constexprs:
        types[name] = "constexpr"
    elif name.endswith("_ptr"):
        types[name] = "*u8" if name == "mask_ptr" else "*fp32"
    else:
        types[name] = "fp32" if name == "eps" else "i32"
shared = {}
for capability in map(int, sys.argv[2:]):
    source = triton.compiler.ASTSource(kernel, types, constexprs)
    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32), options=module.LAUNCH)
    assert compiled.asm["ptx"] and compiled.asm["cubin"], "PTX, and ptxas assembled it"
    shared[capability] = compiled.metadata.shared
print(json.dumps(shared))
"""


@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_compiles_and_its_shared_memory_fits(kernel):
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", COMPILE, kernel, *map(str, SHARED_MEMORY)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    shared = {int(c): size for c, size in json.loads(done.stdout.strip().splitlines()[-1]).items()}
    for capability, limit in SHARED_MEMORY.items():
        assert shared[capability] <= limit, (
            f"{kernel} asks for {shared[capability]} bytes of shared memory on sm_{capability}, "
            f"more than {limit}"
        )
