"""``torch.compile`` of the attention modules: whole graphs, no recompilation, and the eager results.

Graph breaks and recompilations are decided by Dynamo, whatever the backend: the family-by-family checks run
Dynamo and AOT autograd (``backend="aot_eager"``, forward and backward graphs, no C compiler needed for
them), one pair runs through inductor (CPU, C++) to check that the compiled code equals eager. Slow (tracing
takes seconds per module): marked ``slow``, run by the ``tests-all`` nox session only.
"""

import copy
import shutil

import pytest
import torch

import rf_attention

needs_compiler = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None,
    reason="torch.compile's CPU backend (inductor) needs a C compiler (cc or gcc); none on this platform",
)

pytestmark = [
    pytest.mark.slow,
    # Dynamo's notice that it traces through rf_matrices' lru_cache'd Hadamard factor (a constant; safe)
    pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`"),
]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Every test starts from an empty Dynamo cache (its own compilations only) and torch seed 0."""
    torch._dynamo.reset()
    torch.manual_seed(0)


#: One pair per component family, learnable FastFood_L included; causal and not.
PAIRS = [
    ("trigrf-sorf", False),
    ("posrf-fastfoodl", True),
    ("posrf-hyp-qmc", False),
    ("gerf-orf", True),
    ("oprf-fastfoodl", False),
    ("oprf-orf", True),
    ("saderf-base", False),
    ("saderf-orf", True),
]


def train_steps(
    module: torch.nn.Module, x: torch.Tensor, steps: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Outputs and parameter gradients of ``steps`` training steps (gradients cleared before each)."""
    outputs, gradients = [], []
    for _ in range(steps):
        module.zero_grad()
        y = module(x)
        y.square().sum().backward()
        outputs.append(y.detach())
        gradients += [p.grad.clone() for p in module.parameters() if p.grad is not None]
    return outputs, gradients


@pytest.mark.parametrize(
    ("name", "causal"), PAIRS, ids=[f"{n}-{'causal' if c else 'full'}" for n, c in PAIRS]
)
def test_training_step_compiles_to_one_graph_and_never_recompiles(name, causal):
    module = rf_attention.create(name, 32, 2, num_features=8, causal=causal, seed=0).train()
    eager = copy.deepcopy(module)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 40, 32)
    # fullgraph: a graph break raises; error_on_recompile: a recompilation raises
    with torch._dynamo.config.patch(error_on_recompile=True):
        outputs, gradients = train_steps(compiled, x, steps=2)
    expected_outputs, expected_gradients = train_steps(eager, x, steps=2)
    for a, b in zip(outputs, expected_outputs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert len(gradients) == len(expected_gradients) > 0
    if causal and name.split("-")[0] in ("oprf", "saderf"):
        return  # gradients: see test_running_statistics_gradients_under_aot_autograd
    # TrigRF's signed normalizer (8 features) amplifies float32 rounding, and aot's decompositions round
    # differently from eager: their gradients differ by up to 2.5e-4 relative there
    rtol = 1e-3 if name.startswith("trigrf") else 1e-4
    for a, b in zip(gradients, expected_gradients, strict=True):
        torch.testing.assert_close(a, b, rtol=rtol, atol=1e-5)


def test_running_statistics_gradients_under_aot_autograd_equal_eager():
    # the running statistics (SADERF's Psi, OPRF's A) are updated in place during the step
    module = rf_attention.create("saderf-orf", 32, 2, num_features=8, causal=True, seed=0).train()
    eager = copy.deepcopy(module)
    x = torch.randn(2, 40, 32)
    _, got = train_steps(torch.compile(module, fullgraph=True, backend="aot_eager"), x, steps=1)
    for a, b in zip(got, train_steps(eager, x, steps=1)[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@needs_compiler
@pytest.mark.parametrize("name", ["oprf-fastfoodl", "nystromformer"])
def test_compiled_module_equals_eager(name):
    attn = rf_attention.create(name, 32, 2, num_features=16, seed=0).eval()
    x = torch.randn(2, 40, 32)
    mask = torch.zeros(2, 40, dtype=torch.bool)
    mask[1, 30:] = True
    with torch.no_grad():
        eager = attn(x, key_padding_mask=mask)
        compiled = torch.compile(attn)(x, key_padding_mask=mask)
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)


@needs_compiler
def test_inductor_training_step_equals_eager():
    module = rf_attention.create("posrf-orf", 32, 2, num_features=8, causal=True, seed=0).train()
    eager = copy.deepcopy(module)
    x = torch.randn(2, 40, 32)
    with torch._dynamo.config.patch(error_on_recompile=True):
        outputs, gradients = train_steps(torch.compile(module, fullgraph=True), x, steps=2)
    expected_outputs, expected_gradients = train_steps(eager, x, steps=2)
    for a, b in zip(outputs + gradients, expected_outputs + expected_gradients, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def matrix_after_each_step(module: torch.nn.Module, x: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The feature map's dense weight matrix after each of ``steps`` training steps."""
    matrices = []
    for _ in range(steps):
        train_steps(module, x, steps=1)
        matrices.append(module.feature_map.weight_matrix.matrix().detach().clone())
    return matrices


@pytest.mark.parametrize("name", ["posrf-orf", "trigrf-sorf", "saderf-qmc"])
def test_training_with_periodic_redraws_compiles_to_one_graph_and_redraws_as_eager(name):
    module = rf_attention.create(name, 32, 2, num_features=16, seed=0, redraw_interval=2).train()
    eager = copy.deepcopy(module)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 40, 32)
    with torch._dynamo.config.patch(error_on_recompile=True):
        got = matrix_after_each_step(compiled, x, steps=5)
    expected = matrix_after_each_step(eager, x, steps=5)
    # redrawn before calls 2 and 4 (counting from 0), from the same generator as eager's
    changed = [not torch.equal(got[i], got[i + 1]) for i in range(len(got) - 1)]
    assert changed == [False, True, False, True]
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(compiled(x), eager(x), rtol=1e-5, atol=1e-6)
