"""rf-attention on every available device against the float64 references on the CPU.

Parametrized over the device as flash-linear-attention parametrizes its tests: ``cpu`` always, ``cuda``
where a GPU is (skipped elsewhere). Each case: one ``<component>-<matrix>`` pair (an unstructured and the
learnable matrix per component), causal or not, with key and query padding, in float32 and bfloat16; the
outputs and the gradients (``dq, dk, dv`` and the matrix parameters) against ``rf_attention.naive`` in
float64 on the CPU with the same feature map. N = 24 is not a multiple of any chunk size.
"""

import copy
import shutil

import pytest
import torch

import rf_attention as rfa
import rf_features
from rf_attention import rf_attention, softmax_attention
from rf_attention.naive import naive_rf_attention, naive_softmax_attention
from spectraformer_core.testing import assert_rel_close, relative_error, seeded_randn

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]
#: Largest relative error accepted per dtype (bfloat16 inputs, float32 sums); TrigRF's signed features 10x.
TOLERANCE = {torch.float32: 2e-3, torch.bfloat16: 6e-2}
PAIRS = [f"{c}-{m}" for c in rf_features.names() for m in ("orf", "fastfoodl")]
N = 24


def padding() -> torch.Tensor:
    """``(2, N)``: the second sequence's last quarter is padding."""
    mask = torch.zeros(2, N, dtype=torch.bool)
    mask[1, N - N // 4 :] = True
    return mask


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("pair", PAIRS)
def test_outputs_and_gradients_equal_the_float64_reference(pair, causal, dtype, device):
    component, matrix = rfa.split_pair(pair)
    fm = rf_features.create(
        component,
        weight_matrix=matrix,
        num_features=32,
        dim=16,
        seed=0,
        statistics_mode="running" if causal else "batch",
    ).eval()
    if hasattr(fm, "running_a"):
        fm.running_a.fill_(-0.05)
    reference_map = copy.deepcopy(fm).double()
    fm = fm.to(device)
    g = torch.Generator().manual_seed(0)
    q, k, v, w = (torch.randn(2, 2, N, 16, generator=g, dtype=torch.float64) for _ in range(4))
    inputs = [t.to(device, dtype).requires_grad_() for t in (q, k, v)]
    mask = padding()
    masks = {"key_padding_mask": mask.to(device), "query_padding_mask": mask.to(device)}
    out = rf_attention(*inputs, fm, causal=causal, **masks)
    got = torch.autograd.grad((out.float() * w.to(device)).sum(), [*inputs, *fm.parameters()])
    exact = [t.detach().cpu().double().requires_grad_() for t in inputs]  # the inputs as rounded
    expected_out = naive_rf_attention(
        *exact, reference_map, causal=causal, key_padding_mask=mask, query_padding_mask=mask
    )
    expected = torch.autograd.grad((expected_out * w).sum(), [*exact, *reference_map.parameters()])
    errors = [relative_error(out, expected_out)]
    errors += [relative_error(a, b) for a, b in zip(got, expected, strict=True)]
    assert max(errors) < TOLERANCE[dtype] * (10 if component == "trigrf" else 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_sdpa_with_key_padding_equals_the_float64_softmax(causal, dtype, device):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, N, 16, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.zeros(2, N, dtype=torch.bool)
    mask[0, N // 2 :] = True
    out = softmax_attention(
        *(t.to(device, dtype) for t in (q, k, v)), causal=causal, key_padding_mask=mask.to(device)
    )
    exact = naive_softmax_attention(q, k, v, causal=causal, key_padding_mask=mask)
    assert relative_error(out, exact) < TOLERANCE[dtype]


#: ``torch.compile`` per device: inductor on the CPU needs a C compiler and minutes (``slow``, the tests-all
#: session; rf-attention's test_compile.py checks it there too), Triton on CUDA.
COMPILE_DEVICES = [
    pytest.param(
        "cpu",
        marks=[
            pytest.mark.slow,
            pytest.mark.skipif(
                shutil.which("cc") is None and shutil.which("gcc") is None, reason="inductor needs cc or gcc"
            ),
        ],
    ),
    DEVICES[1],
]


@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
@pytest.mark.parametrize("device", COMPILE_DEVICES)
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_a_compiled_training_step_never_recompiles_and_equals_eager(causal, device):
    torch._dynamo.reset()
    module = rfa.create("posrf-orf", 64, 8, num_features=128, causal=causal, seed=0).to(device).eval()
    eager = copy.deepcopy(module)  # eval: fixed statistics, so eager and compiled see the same ones
    compiled = torch.compile(module, fullgraph=True)
    x = seeded_randn(2, 256, 64).to(device)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(2):  # the first call compiles; the second must not recompile
            compiled(x).square().sum().backward()
        assert_rel_close("compiled output", eager(x), compiled(x), 1e-4)
