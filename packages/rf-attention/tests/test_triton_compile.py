"""Every Triton kernel compiled ahead of time for sm_80 (A100) and sm_90 (H100), no GPU needed.

``triton.compile`` with the bundled ``ptxas`` at the launch configuration of ``B H`` sequences of
``Dh = 64`` with 128 features (every optional part on: mask, signs, waves), asserting that the shared
memory a program asks for fits one block's opt-in maximum on that architecture. Runs in the
``tests-triton`` nox session (``TRITON_INTERPRET=1``) and on a CUDA device.
"""

import os

import pytest
import torch

INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
if not INTERPRETING and not torch.cuda.is_available():
    pytest.skip(
        "the Triton kernels are compiled in the tests-triton session (TRITON_INTERPRET=1) or on a GPU",
        allow_module_level=True,
    )
triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402  (after the skip: triton is optional)

from rf_attention.ops.triton import chunk, fused_recurrent, noncausal  # noqa: E402

#: Shared memory one block may opt in to (``cudaDevAttrMaxSharedMemoryPerBlockOptin``), bytes.
SHARED_MEMORY = {80: 163 * 1024, 90: 227 * 1024}
HEAD_DIM, FEATURES = 64, 128
FLAGS = {"HAS_MASK": True, "HAS_SIGN": True, "TRIG": True}
#: (kernel, its blocks at the launch configuration, warps)
KERNELS = [
    (noncausal.key_sums_kernel, {"BN": noncausal.BLOCK_ROWS}, noncausal.NUM_WARPS),
    (noncausal.query_outputs_kernel, {"BN": noncausal.BLOCK_ROWS}, noncausal.NUM_WARPS),
    (noncausal.query_grads_kernel, {"BN": noncausal.BLOCK_ROWS}, noncausal.NUM_WARPS),
    (noncausal.key_grads_kernel, {"BN": noncausal.BLOCK_ROWS}, noncausal.NUM_WARPS),
    (chunk.chunk_forward_kernel, {"BC": chunk.DEFAULT_CHUNK}, chunk.NUM_WARPS),
    (chunk.chunk_query_grads_kernel, {"BC": chunk.DEFAULT_CHUNK}, chunk.NUM_WARPS),
    (chunk.chunk_key_grads_kernel, {"BC": chunk.DEFAULT_CHUNK}, chunk.NUM_WARPS),
    (fused_recurrent.fused_recurrent_kernel, {"BW": 128}, fused_recurrent.NUM_WARPS),
]


def signature(kernel, constexprs):
    """Argument types: float32 pointers (the mask: uint8), int32 sizes, a float32 ``eps``, the constexprs."""
    types = {}
    for name in kernel.arg_names:
        if name in constexprs:
            types[name] = "constexpr"
        elif name.endswith("_ptr"):
            types[name] = "*u8" if name == "mask_ptr" else "*fp32"
        else:
            types[name] = "fp32" if name == "eps" else "i32"
    return types


@pytest.mark.parametrize("capability", sorted(SHARED_MEMORY), ids=lambda c: f"sm_{c}")
@pytest.mark.parametrize(("kernel", "blocks", "warps"), KERNELS, ids=[k.__name__ for k, _, _ in KERNELS])
def test_kernel_compiles_and_its_shared_memory_fits(kernel, blocks, warps, capability):
    sizes = {"BD": HEAD_DIM, "BM": FEATURES, "BV": HEAD_DIM, **blocks, **FLAGS}
    constexprs = {name: value for name, value in sizes.items() if name in kernel.arg_names}
    source = triton.compiler.ASTSource(kernel, signature(kernel, constexprs), constexprs)
    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32), options={"num_warps": warps})
    assert compiled.asm["ptx"], "PTX"
    assert "cubin" in compiled.asm, "ptxas assembled it"
    shared = compiled.metadata.shared
    assert shared <= SHARED_MEMORY[capability], (
        f"{kernel.__name__} asks for {shared} bytes of shared memory on sm_{capability}, "
        f"more than {SHARED_MEMORY[capability]}"
    )
